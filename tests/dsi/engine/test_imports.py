"""The engine's one door, checked on the source with ``ast`` (nothing is imported):

(a) no import cycle passes through a module of dsi/engine. Every import statement counts: at
    module level, under ``if TYPE_CHECKING:``, and inside functions. A cycle that only a
    TYPE_CHECKING guard or a lazy import keeps from failing at run time is still a circle in the
    design (the one that ``RequestState.from_buffer(engine)`` made went through such a guard).
(b) roles reach an engine only through ``EngineService`` and the public names of ``dsi.engine``
    (shape, load, CachedPrefix, RequestState, ...): no import of the engine's own modules (but
    ``dsi.engine.params``, the torch-free home of SamplingParams), no ``Engine``, no ``.engine``
    or ``._engine`` attribute, no ``service.call(fn)`` (which hands ``fn`` the engine), and no
    scheduler / runner / pool / stats / config read off anything named ``engine``.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
FOLDERS = {
    "dsi": "dsi",
    "dsi.transport": "transport",
    "dsi.roles": "roles",
    "dsi.kvcache": "kvcache",
    "dsi.kernels": "kernels",
}  # import name -> folder (setup.py)
ENGINE = "dsi.engine"
# engine modules roles may import directly: torch-free values and pure policies
ROLE_MODULES_OF_ENGINE = {"dsi.engine.params", "dsi.engine.hit_policy"}
NOT_FOR_ROLES = {"Engine", "EngineStats"}  # public engine names that are internals to a role
INTERNALS = {
    "scheduler",
    "runner",
    "pool",
    "slots",
    "stats",
    "leases",
    "requests",
    "cfg",
    "config",
    "hash_chain",
    "full_pages",
    "ring_snapshots",
    "timings",
}
_ENGINE_NAMED = re.compile(r"(^|\.)_?engine$")
_SERVICE_NAMED = re.compile(r"(^|\.)_?service$")


# ---- reading the tree ----------------------------------------------------------------------------
def sources(root: Path = ROOT) -> dict[str, str]:
    """Module name -> source of every module of the dsi distribution under ``root``."""
    out = {}
    for package, folder in FOLDERS.items():
        base = root / folder
        for path in sorted(base.rglob("*.py")):
            parts = path.relative_to(base).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            name = ".".join((package, *parts))
            if package == "dsi" and parts and f"dsi.{parts[0]}" in FOLDERS:
                continue  # not a folder of dsi/ in this layout
            out[name] = path.read_text()
    return out


def lazy_homes(source: str) -> dict[str, str]:
    """A package's ``_HOMES = {"Name": "module"}`` (names it imports lazily from submodules)."""
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "_HOMES" for t in node.targets
        ):
            return ast.literal_eval(node.value)
    return {}


def imports(name: str, source: str, known: set[str], homes: dict[str, dict[str, str]]) -> set[str]:
    """Modules among ``known`` that module ``name`` imports anywhere in its source."""
    is_package = any(k.startswith(name + ".") for k in known)  # where its relative imports start
    out = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out |= {_known_prefix(alias.name, known) for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(name, node, is_package)
            for alias in node.names:
                full = f"{base}.{alias.name}"
                if full in known:
                    out.add(full)
                elif alias.name in homes.get(base, {}):
                    out.add(f"{base}.{homes[base][alias.name]}")
                else:
                    out.add(_known_prefix(base, known))
    out.discard(None)
    out.discard(name)
    return out


def _absolute(name: str, node: ast.ImportFrom, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    parts = name.split(".")
    drop = node.level - 1 if is_package else node.level
    base = parts[: len(parts) - drop] if drop else parts
    return ".".join(base + ([node.module] if node.module else []))


def _known_prefix(module: str, known: set[str]) -> str | None:
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in known:
            return ".".join(parts[:n])
    return None


def import_graph(srcs: dict[str, str]) -> dict[str, set[str]]:
    known = set(srcs)
    homes = {name: lazy_homes(src) for name, src in srcs.items()}
    return {name: imports(name, src, known, homes) for name, src in srcs.items()}


def cycles_through(graph: dict[str, set[str]], prefix: str) -> list[list[str]]:
    """One cycle (as a path that returns to its start) per strongly connected component that holds
    a module of ``prefix`` and more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            inside = sorted(m for m in component if m == prefix or m.startswith(prefix + "."))
            if len(component) > 1 and inside:
                found.append(_path(graph, component, inside[0]))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _path(graph: dict[str, set[str]], component: set[str], start: str) -> list[str]:
    """A shortest cycle from ``start`` back to it inside ``component`` (breadth first)."""
    parent: dict[str, str] = {}
    queue = [start]
    while queue:
        v = queue.pop(0)
        for w in sorted(graph[v] & component):
            if w == start:
                path = [v]
                while path[-1] != start:
                    path.append(parent[path[-1]])
                return [start, *reversed(path[:-1]), start] if len(path) > 1 else [start, v, start]
            if w not in parent:
                parent[w] = v
                queue.append(w)
    raise AssertionError(f"{start} is in no cycle of its component")


def role_violations(name: str, source: str, public: set[str]) -> list[str]:
    """Where module ``name`` (a role) reaches past the engine's door."""
    allowed = public - NOT_FOR_ROLES
    out = []
    for node in ast.walk(ast.parse(source)):
        line = f"{name}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith(ENGINE + ".") and alias.name not in ROLE_MODULES_OF_ENGINE:
                    out.append(f"{line}: import {alias.name}")
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.module.startswith(ENGINE + ".") and node.module not in ROLE_MODULES_OF_ENGINE:
                out.append(f"{line}: from {node.module} import ...")
            elif node.module == ENGINE:
                out += [
                    f"{line}: from dsi.engine import {a.name}" for a in node.names if a.name not in allowed
                ]
        elif isinstance(node, ast.Attribute) and _reaches_in(ast.unparse(node.value), node.attr, allowed):
            out.append(f"{line}: {ast.unparse(node)}")
    return out


def _reaches_in(base: str, attr: str, allowed: set[str]) -> bool:
    """Whether ``base.attr`` in a role reads past the engine's door."""
    if attr in ("engine", "_engine"):
        # a role holds no engine: node.engine is the [engine] config section and options.engine
        # the name of the engine a role runs ("dsi" or "vllm"), both plain configuration
        return base not in ("node", "options")
    if _ENGINE_NAMED.search(base):
        return attr in INTERNALS
    if _SERVICE_NAMED.search(base):
        return attr == "call" or attr.startswith("_")  # call(fn) hands fn the engine
    return base == ENGINE and attr not in allowed


# ---- the checks on this tree ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def tree() -> dict[str, str]:
    return sources()


def test_no_import_cycle_passes_through_the_engine(tree):
    assert any(name.startswith(ENGINE + ".") for name in tree)
    cycles = cycles_through(import_graph(tree), ENGINE)
    assert not cycles, "import cycles through dsi/engine:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_roles_use_only_the_engines_door(tree):
    public = set(lazy_homes(tree[ENGINE]))
    assert {"EngineService", "EngineShape", "EngineLoad"} <= public
    found = [
        v
        for name, src in tree.items()
        if name.startswith("dsi.roles.")
        for v in role_violations(name, src, public)
    ]
    assert not found, "roles reach past EngineService:\n" + "\n".join(found)


# ---- the checks can fail -------------------------------------------------------------------------
def test_a_cycle_hidden_behind_type_checking_is_found():
    srcs = {  # the shape of the old circle: engine -> admission -> transfer -(TYPE_CHECKING)-> engine
        "dsi.engine": '_HOMES = {"RequestState": "transfer"}',
        "dsi.engine.engine": "from dsi.engine.admission import check_state",
        "dsi.engine.admission": "from dsi.engine import RequestState",
        "dsi.engine.transfer": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from dsi.engine.engine import Engine",
        "dsi.engine.params": "import msgspec",
        "dsi.model.reference": "def f():\n    from . import config",
        "dsi.model.config": "from dsi.model import reference",
    }
    graph = import_graph(srcs)
    assert graph["dsi.engine.admission"] == {"dsi.engine.transfer"}
    assert graph["dsi.model.reference"] == {"dsi.model.config"}
    assert cycles_through(graph, ENGINE) == [
        ["dsi.engine.admission", "dsi.engine.transfer", "dsi.engine.engine", "dsi.engine.admission"]
    ]
    assert cycles_through(graph, "dsi.model") == [
        ["dsi.model.config", "dsi.model.reference", "dsi.model.config"]
    ]


def test_reads_past_the_door_are_found():
    old = """
from dsi.engine.engine import Engine, EngineConfig
from dsi.engine import CachedPrefix, Engine
from dsi.engine.params import SamplingParams
import dsi.engine.scheduler

class R:
    @property
    def engine(self):
        return self.service.engine

    def load(self):
        sched = self.engine.scheduler
        engine = self.engine
        return engine.runner.pool, engine.stats.cached_tokens, engine.cfg.block_size

    async def sneak(self):
        return await self.service.call(lambda e: e.scheduler), self.service._engine
"""
    found = role_violations("dsi.roles.x", old, {"CachedPrefix", "Engine", "EngineService"})
    assert {v.split(": ", 1)[1] for v in found} == {
        "from dsi.engine.engine import ...",
        "from dsi.engine import Engine",
        "import dsi.engine.scheduler",
        "self.service.engine",
        "self.engine",
        "self.engine.scheduler",
        "engine.runner",
        "engine.stats",
        "engine.cfg",
        "self.service.call",
        "self.service._engine",
    }
    good = """
from dsi.engine import CachedPrefix, EngineService
from dsi.engine.params import SamplingParams

def f(self):
    return self.service.shape.block_size, self.service.load.running, self.kvstore.stats, self.states.stats
"""
    assert role_violations("dsi.roles.y", good, {"CachedPrefix", "EngineService"}) == []
