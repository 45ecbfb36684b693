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
# 4 min 55 s, measured). The systemd, monitoring, container and real-PD tiers each share one booted container,
# one Prometheus, one dockerd (and the images it built) or one real prefill/decode pair across their tests, which
# run in order, so each is one pytest process of its own beside the workers (its output follows theirs, from .venv/tier-*.log). The real-serving tier
# then runs alone, one real SGLang server at a time.
SERIAL_TIERS := systemd monitoring container real_pd

test: lint typecheck
	@rc=0; pids=""; slice=9; \
	for tier in $(SERIAL_TIERS); do \
	  SGLSUP_TEST_PORT_SLICE=$$slice $(BIN)/python -m pytest tests/$$tier $(PYTEST_ARGS) > $(VENV)/tier-$$tier.log 2>&1 & \
	  pids="$$pids $$!"; slice=$$((slice + 1)); \
	done; \
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist worksteal --ignore=tests/real_serving \
	  $(foreach tier,$(SERIAL_TIERS),--ignore=tests/$(tier)) $(PYTEST_ARGS) || rc=1; \
	for pid in $$pids; do wait $$pid || rc=1; done; \
	for tier in $(SERIAL_TIERS); do echo "== tests/$$tier"; cat $(VENV)/tier-$$tier.log; done; \
	exit $$rc
	$(BIN)/python -m pytest tests/real_serving $(PYTEST_ARGS)

unit: $(STAMP)
	$(BIN)/python -m pytest -m unit $(PYTEST_ARGS)

demo: $(STAMP)
	$(BIN)/sglang-supervisor demo

bench: $(STAMP)
	$(BIN)/python -m benchmarks.run_all

clean:
	rm -rf $(VENV) build *.egg-info .mypy_cache .pytest_cache .ruff_cache
