# sglang-supervisor — the README's two commands are `make demo` and `make test`.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | sha1sum | cut -c1-12)
PYTEST_ARGS ?=
PYTEST_WORKERS ?= 8

.PHONY: venv test lint typecheck unit demo bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

venv: $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy supervisor probes policies simulator benchmarks

# The e2e tier mostly waits on servers, so eight workers fit two cores (tests/conftest.py orders them, slowest
# first). Work stealing matters: xdist's default `load` hands each worker a fixed slice of the first quarter of the
# tests up front, which put the slow tiers in six queues and left two workers idle after 20 s (7 min 40 s against
# 4 min 55 s, measured). The real-serving tier then runs alone, one real SGLang server at a time.
test: lint typecheck
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist worksteal --ignore=tests/real_serving $(PYTEST_ARGS)
	$(BIN)/python -m pytest tests/real_serving $(PYTEST_ARGS)

unit: $(STAMP)
	$(BIN)/python -m pytest -m unit $(PYTEST_ARGS)

demo: $(STAMP)
	$(BIN)/sglang-supervisor demo

bench: $(STAMP)
	$(BIN)/python -m benchmarks.run_all

clean:
	rm -rf $(VENV) build *.egg-info .mypy_cache .pytest_cache .ruff_cache
