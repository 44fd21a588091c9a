"""[engine] device: parsing, refusal of devices that are unknown or not here, placement of the
runner's weights and caches, and the kernel dispatch point."""

import pytest
import torch

from dsi.config import ConfigError, parse_config
from dsi.engine import Engine, EngineConfig, SamplingParams
from dsi.engine.device import decode_kernels, parse_device, resolve_device
from dsi.engine.runner import ModelRunner

MINIMAL = {
    "cluster": {"controller": "tcp://127.0.0.1:7100"},
    "roles": [{"kind": "prefill", "id": "prefill-0", "bind": "tcp://127.0.0.1:7110"}],
}


def test_the_config_reads_a_device_and_refuses_a_bad_one(tmp_path):
    cfg = parse_config({**MINIMAL, "engine": {"device": "cuda:1"}}, tmp_path / "n.toml")
    assert cfg.engine.device == "cuda:1"  # read on any machine; checked where an engine starts
    assert parse_config(MINIMAL, tmp_path / "d.toml").engine.device == "cpu"
    with pytest.raises(ConfigError, match=r"engine\.device") as err:
        parse_config({**MINIMAL, "engine": {"device": "gpu0"}}, tmp_path / "bad.toml")
    assert "'gpu0'" in str(err.value) and "bad.toml" in str(err.value)


def test_unknown_and_unavailable_devices_name_the_key():
    with pytest.raises(ValueError, match=r"\[engine\] device = 'tpu9'"):
        parse_device("tpu9")
    with pytest.raises(ValueError, match=r"\[engine\] device"):
        EngineConfig(device="cuda:x")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match=r"\[engine\] device = 'cuda'.*no CUDA device"):
            resolve_device("cuda")
    assert resolve_device("cpu") == torch.device("cpu")


def test_an_engine_on_another_device_is_refused_before_it_allocates(tiny):
    cfg, weights = tiny
    for device in ("meta", "cuda:7"):
        with pytest.raises(ValueError, match=rf"\[engine\] device = '{device}'"):
            Engine(cfg, weights, EngineConfig(num_blocks=8, num_slots=2, device=device))


def test_device_cpu_is_the_default_engine(tiny):
    cfg, weights = tiny
    runs = []
    for config in (
        EngineConfig(num_blocks=8, num_slots=2),
        EngineConfig(num_blocks=8, num_slots=2, device="cpu"),
    ):
        engine = Engine(cfg, weights, config)
        engine.add_request("r", list(range(100, 120)), SamplingParams(max_tokens=3, temperature=0.0))
        runs.append(engine.run_until_done()[-1].output)
        assert engine.runner.pool.pages.device.type == "cpu" and engine.runner.kernels is None
        engine.close()
    assert runs[0] == runs[1] and len(runs[0]) == 3


def test_the_runner_places_weights_pages_and_state_on_its_device(tiny):
    cfg, weights = tiny
    runner = ModelRunner(cfg, weights, 4, 2, device=torch.device("meta"))
    held = [runner.pool.pages, runner.slots.rings, runner.slots.partial, *runner.w.values()]
    held += [runner._glob_view, *runner._src_views]
    assert {t.device.type for t in held} == {"meta"}
    assert weights["embed"].device.type == "cpu"  # the caller's weights stay where they were


def test_the_kernels_are_picked_on_cuda_only():
    assert decode_kernels(torch.device("cpu")) is None
    assert decode_kernels(torch.device("meta")) is None


def test_the_config_check_agrees_with_torch_on_device_strings():
    """dsi.engine.device.device_problem checks torch's own device types without torch."""
    from dsi.engine.device import device_problem

    for text in ("cpu", "cuda", "cuda:0", "cuda:12", "cpu:0", "meta", "xpu:1", "privateuseone", "Cuda", "cuda:01",
                 "cuda:-1", "gpu0", "cuda:x", "cuda:", ":0", " cpu", "tpu9"):  # fmt: skip
        try:
            torch.device(text)
            ok = True
        except (RuntimeError, TypeError, ValueError):
            ok = False
        assert (device_problem(text) is None) == ok, text
