"""The config reference is generated from the schema: every key and table has a description,
every check says what it allows, and every key the shipped configs use has its row."""

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from dsi.config.docs import Table, UndocumentedError, reference, undocumented
from dsi.config.spec import greater, spec

REPO = Path(__file__).resolve().parents[3]
CONFIGS = sorted((REPO / "configs").glob("**/*.toml"))


def test_every_key_and_table_of_a_node_config_has_a_description():
    assert undocumented() == []


@dataclass(slots=True, frozen=True, kw_only=True)
class _Undescribed:
    plain: int = 1
    checked: int = field(default=2, metadata=spec(doc="Checked.", checks=(lambda value, _: None,)))
    described: float = field(default=1.0, metadata=spec(doc="Fine.", checks=(greater(0.0),)))
    odd: complex = field(default=0j, metadata=spec(doc="No TOML kind."))


def test_a_missing_description_or_a_check_without_words_is_reported():
    missing = undocumented([Table("[odd]", _Undescribed, "odd")])
    assert missing == [
        "[odd] (class _Undescribed has no docstring)",
        "odd.plain (no doc)",
        "odd.checked (a check that is not a Rule)",
        "odd.odd (no TOML name for the type <class 'complex'>)",
    ]


def _rows(text: str) -> dict[str, set[str]]:
    """The keys listed under each ``## `` header of the reference."""
    found: dict[str, set[str]] = {}
    for section in text.split("\n## ")[1:]:
        header, _, body = section.partition("\n")
        found[header] = set(re.findall(r"(?m)^\| `([^`]+)` \|", body))
    return found


def _tables(data: dict, path: str = ""):
    """(dotted table path, its scalar keys) for every table of a TOML document, [[roles]] entries
    as ``roles:KIND``."""
    keys = {k for k, v in data.items() if not isinstance(v, dict) and k != "roles"}
    if path:
        yield path, keys
    for key, value in data.items():
        if isinstance(value, dict):
            yield from _tables(value, f"{path}.{key}".lstrip("."))
    for role in data.get("roles", []) if not path else []:
        yield f"roles:{role['kind']}", {k for k, v in role.items() if not isinstance(v, dict)}
        for key, value in role.items():
            if isinstance(value, dict):
                yield from _tables(value, f"roles.{key}")


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_key_of_the_shipped_configs_has_its_row(path):
    rows = _rows(reference())
    with open(path, "rb") as f:
        data = tomllib.load(f)
    for table, keys in _tables(data):
        if table.startswith("roles:"):
            kind = table.removeprefix("roles:")
            [own] = [h for h in rows if h.startswith("[[roles]] with kind") and f'"{kind}"' in h]
            known = rows["[[roles]]"] | rows[own]
        elif headers := [h for h in rows if f"[{table}]" in h.split(", ")]:
            known = rows[headers[0]]
        else:  # an inline table that is one key's value ([roles.vllm] args)
            parent, _, key = table.rpartition(".")
            assert any(key in rows[h] for h in rows if f"[{parent}]" in h.split(", ")), table
            continue
        assert keys <= known, (table, keys - known)


def test_the_reference_refuses_to_leave_a_key_out(monkeypatch):
    monkeypatch.setattr("dsi.config.docs.undocumented", lambda: ["cluster.name (no doc)"])
    with pytest.raises(UndocumentedError, match=r"cluster\.name"):
        reference()
