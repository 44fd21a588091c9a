"""Fixtures shared across the test tree."""

import os

# Under pytest-xdist (``-n``) each worker picks its free ports, and so do the processes it starts,
# from a range of its own below the kernel's ephemeral range: two workers never hand out one port.
# Set before tests.dsi.cli.procs copies the environment its role processes get.
if os.environ.get("PYTEST_XDIST_WORKER", "").startswith("gw") and "DSI_PORT_RANGE" not in os.environ:
    _worker, _workers = (
        int(os.environ["PYTEST_XDIST_WORKER"][2:]),
        int(os.environ["PYTEST_XDIST_WORKER_COUNT"]),
    )
    _size = (32_767 - 10_000 + 1) // _workers
    os.environ["DSI_PORT_RANGE"] = f"{10_000 + _worker * _size}-{10_000 + (_worker + 1) * _size - 1}"


def _import_triton_for_its_interpreter() -> None:
    """Triton decorates its own library's jit functions (``tl.zeros`` among them) once, when
    ``triton.language`` is first imported, for the interpreter only if ``TRITON_INTERPRET=1`` is
    set then. Kernel tests turn the interpreter on later (tests.kernels.interpreted), so a worker
    that imported Triton first for anything else ran those kernels against compiled-mode library
    functions and failed ("Cannot call @triton.jit'd outside of the scope of a kernel"). Importing
    it here with the variable set, then restoring the environment, leaves dsi's own ``interpreting()``
    off until a test turns it on."""
    before = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        import triton.language  # noqa: F401
    except ImportError:
        pass
    finally:
        if before is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = before


_import_triton_for_its_interpreter()

import pytest  # noqa: E402

from tests.dsi.cli.procs import Procs  # noqa: E402


@pytest.fixture
def procs(tmp_path):
    """Processes a test starts; every one is stopped at teardown (by PID)."""
    with Procs(tmp_path) as group:
        yield group


@pytest.fixture(scope="session")
def smollm2_dir(tmp_path_factory):
    """SmolLM2-135M-Instruct imported from its GGUF (once per session; skipped where not installed)."""
    from tests.smollm2 import import_smollm2, one_torch_thread

    with one_torch_thread():
        return import_smollm2(tmp_path_factory.mktemp("smollm2"))


@pytest.fixture(scope="session")
def smollm2_greedy(smollm2_dir):
    """(prompts, transformers' greedy tokens) for the eight chat prompts of tests/smollm2.py."""
    from tests.smollm2 import GREEDY_TOKENS, PROMPTS, chat_ids, hf_greedy, one_torch_thread

    prompts = [chat_ids(smollm2_dir, q) for q in PROMPTS]
    with one_torch_thread():
        return prompts, hf_greedy(smollm2_dir, prompts, GREEDY_TOKENS)


@pytest.fixture(scope="session")
def gemma3_dir(request, tmp_path_factory):
    """Gemma 3 270M imported from the optional package's GGUF, kept in pytest's cache directory
    (skipped where the package is not installed)."""
    from tests.gemma3 import import_gemma3
    from tests.smollm2 import one_torch_thread

    cache = getattr(request.config, "cache", None)  # absent with -p no:cacheprovider
    where = cache.mkdir("gemma3") if cache is not None else tmp_path_factory.mktemp("gemma3")
    with one_torch_thread():
        return import_gemma3(where)


@pytest.fixture(scope="session")
def gemma3_greedy(gemma3_dir):
    """(prompts, transformers' greedy tokens) for the eight prompts of tests/gemma3.py."""
    from tests.gemma3 import GREEDY_TOKENS, hf_greedy, prompts
    from tests.smollm2 import one_torch_thread

    with one_torch_thread():
        return prompts(), hf_greedy(gemma3_dir, prompts(), GREEDY_TOKENS)
