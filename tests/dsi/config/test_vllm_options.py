"""[[roles]] engine and [roles.vllm]: a vLLM role's options, and the tables that are refused."""

import pickle
from pathlib import Path

import pytest

from dsi.config import ConfigError, EngineOptions, load_config
from dsi.config.vllm import RESERVED_ARGS, VllmOptions

DECODE = """\
[cluster]
controller = "tcp://127.0.0.1:7100"

[[roles]]
kind = "decode"
id = "decode-0"
bind = "tcp://127.0.0.1:7120"
"""


def decode_options(tmp_path: Path, extra: str) -> EngineOptions:
    """The options of the one decode role of a node file with ``extra`` appended to its table."""
    path = tmp_path / "conf" / "node.toml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(DECODE + extra)
    options = load_config(path).role("decode-0").options
    assert isinstance(options, EngineOptions)
    return options


def test_a_vllm_table_is_read(tmp_path):
    options = decode_options(
        tmp_path,
        'engine = "vllm"\n[roles.vllm]\ndtype = "float32"\nmax_model_len = 2048\nkv_cache_gib = 3\n'
        'cpu_threads = "0-3"\nmodel = "models/smol"\npython = "../venv/bin/python"\n'
        "args = { enforce_eager = true, max_num_seqs = 32, cuda_graph_sizes = [1, 2] }\n",
    )
    vllm = options.vllm
    assert options.engine == "vllm"
    assert (vllm.dtype, vllm.max_model_len, vllm.kv_cache_gib, vllm.cpu_threads) == (
        "float32",
        2048,
        3,
        "0-3",
    )
    assert vllm.model == tmp_path / "conf" / "models" / "smol"  # relative to the file's directory
    assert vllm.python == tmp_path / "venv" / "bin" / "python"
    assert isinstance(vllm.args, tuple)  # immutable, and picklable: configs cross process boundaries
    assert dict(vllm.args) == {"enforce_eager": True, "max_num_seqs": 32, "cuda_graph_sizes": (1, 2)}
    assert vllm.args.get("max_num_seqs") == 32
    assert pickle.loads(pickle.dumps(vllm)) == vllm


def test_a_vllm_role_without_the_table_takes_the_defaults(tmp_path):
    options = decode_options(tmp_path, 'engine = "vllm"\n')
    assert options.engine == "vllm"
    assert options.vllm == VllmOptions()
    assert (options.vllm.dtype, options.vllm.max_model_len, options.vllm.kv_cache_gib) == ("auto", 4096, 1)
    assert (options.vllm.model, options.vllm.python, dict(options.vllm.args)) == (None, None, {})
    assert options.vllm.start_timeout_s == 600.0


def test_the_engine_is_dsis_own_by_default(tmp_path):
    assert decode_options(tmp_path, "").engine == "dsi"


@pytest.mark.parametrize(
    ("extra", "key", "reason"),
    [
        ('[roles.vllm]\ndtype = "float32"\n', "roles[0].vllm", 'only a role with engine = "vllm"'),
        ('engine = "dsi"\n[roles.vllm]\nkv_cache_gib = 2\n', "roles[0].vllm", "only a role with engine"),
        ('engine = "foo"\n', "roles[0].engine", "must be one of 'dsi', 'vllm'; got 'foo'"),
        ('engine = "vllm"\n[roles.vllm]\ndtyp = "float32"\n', "roles[0].vllm.dtyp", "unknown key"),
        ('engine = "vllm"\n[roles.vllm]\ndtype = "int8"\n', "roles[0].vllm.dtype", "must be one of"),
        ('engine = "vllm"\n[roles.vllm]\nkv_cache_gib = 0\n', "roles[0].vllm.kv_cache_gib", "must be > 0"),
        ('engine = "vllm"\n[roles.vllm]\nargs = 3\n', "roles[0].vllm.args", "expected a table"),
        (
            'engine = "vllm"\n[roles.vllm]\nargs = { hf_overrides = { a = 1 } }\n',
            "roles[0].vllm.args.hf_overrides",
            "expected a string, number, boolean or an array of them, got a table",
        ),
        (
            'engine = "vllm"\n[roles.vllm]\nargs = { sizes = [{ a = 1 }] }\n',
            "roles[0].vllm.args.sizes",
            "expected a string, number, boolean or an array of them",
        ),
    ],
)
def test_a_bad_table_names_the_file_and_key(tmp_path, extra, key, reason):
    with pytest.raises(ConfigError) as caught:
        decode_options(tmp_path, extra)
    assert caught.value.file.endswith("node.toml")
    assert caught.value.key == key
    assert reason in caught.value.reason


@pytest.mark.parametrize("name", ["model", "block_size", "kv_transfer_config", "enable_prefix_caching"])
def test_args_may_not_name_what_dsi_sets(tmp_path, name):
    assert name in RESERVED_ARGS
    with pytest.raises(ConfigError) as caught:
        decode_options(
            tmp_path, f'engine = "vllm"\n[roles.vllm]\nargs = {{ enforce_eager = true, {name} = 1 }}\n'
        )
    assert caught.value.key == f"roles[0].vllm.args.{name}"
    assert "dsi sets this vLLM argument itself" in caught.value.reason
