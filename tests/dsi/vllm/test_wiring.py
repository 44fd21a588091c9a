"""The per-request connector parameters and the staging directory of a vLLM role."""

from pathlib import Path

from dsi.vllm.wiring import events_endpoint, hit_params, load_params, save_params, staging_dir


def test_save_and_load_params_sit_under_dsis_key():
    assert save_params(Path("/s/req-1")) == {"dsi": {"save": "/s/req-1", "save_first": 0}}
    assert load_params(Path("/s/hit-1"), 256, 2) == {
        "dsi": {"load": "/s/hit-1", "tokens": 256, "blocks": 2, "load_first": 0}
    }


def test_a_hit_loads_and_saves_in_one_table():
    params = hit_params(Path("/s/req-1"), Path("/s/hit-1"), 640, 3, first=2, save_from=5)
    assert params == {
        "dsi": {
            "save": "/s/req-1",
            "save_first": 5,
            "load": "/s/hit-1",
            "tokens": 640,
            "blocks": 3,
            "load_first": 2,
        }
    }


def test_without_a_hit_nothing_is_loaded():
    assert hit_params(Path("/s/req-1"), Path("/s/hit-1"), 0, 0) == {
        "dsi": {"save": "/s/req-1", "save_first": 0}
    }


def test_the_staging_dir_is_one_per_role_and_address():
    one = staging_dir("decode-0", "tcp://127.0.0.1:7120")
    assert one == staging_dir("decode-0", "tcp://127.0.0.1:7120")
    assert one != staging_dir("decode-0", "tcp://127.0.0.1:7220")  # another cluster on this host
    assert one != staging_dir("prefill-0", "tcp://127.0.0.1:7120")
    assert one.name.startswith("dsi-vllm-decode-0-")
    assert one.parent in (Path("/dev/shm"), Path("/tmp"))


def test_vllm_publishes_its_kv_events_in_the_staging_dir():
    assert (
        events_endpoint(Path("/dev/shm/dsi-vllm-decode-0-ab"))
        == "ipc:///dev/shm/dsi-vllm-decode-0-ab/kv-events"
    )
