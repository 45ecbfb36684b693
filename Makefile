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
# 4 min 55 s, measured). The systemd, monitoring and real-PD tiers each share one booted container, one Prometheus
# or one real prefill/decode pair across their tests, which run in order, so each is one pytest process of its own
# beside the workers (its output follows theirs, from .venv/tier-*.log). The real-serving tier then runs one real
# SGLang server at a time, and beside it the container tier (one dockerd and the images it built, its tests in
# order): beside the workers its image builds and containers starved them (four load-timed failures in one run),
# while the real-serving tier mostly waits on its one server.
SERIAL_TIERS := systemd monitoring real_pd
LATE_TIER := container

test: lint typecheck
	@rc=0; pids=""; slice=9; \
	for tier in $(SERIAL_TIERS); do \
	  SGLSUP_TEST_PORT_SLICE=$$slice $(BIN)/python -m pytest tests/$$tier $(PYTEST_ARGS) > $(VENV)/tier-$$tier.log 2>&1 & \
	  pids="$$pids $$!"; slice=$$((slice + 1)); \
	done; \
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist worksteal --ignore=tests/real_serving \
	  --ignore=tests/$(LATE_TIER) $(foreach tier,$(SERIAL_TIERS),--ignore=tests/$(tier)) $(PYTEST_ARGS) || rc=1; \
	for pid in $$pids; do wait $$pid || rc=1; done; \
	for tier in $(SERIAL_TIERS); do echo "== tests/$$tier"; cat $(VENV)/tier-$$tier.log; done; \
	exit $$rc
	@rc=0; SGLSUP_TEST_PORT_SLICE=12 $(BIN)/python -m pytest tests/$(LATE_TIER) $(PYTEST_ARGS) \
	  > $(VENV)/tier-$(LATE_TIER).log 2>&1 & late=$$!; \
	$(BIN)/python -m pytest tests/real_serving $(PYTEST_ARGS) || rc=1; \
	wait $$late || rc=1; echo "== tests/$(LATE_TIER)"; cat $(VENV)/tier-$(LATE_TIER).log; exit $$rc

unit: $(STAMP)
	$(BIN)/python -m pytest -m unit $(PYTEST_ARGS)

demo: $(STAMP)
	$(BIN)/sglang-supervisor demo

bench: $(STAMP)
	$(BIN)/python -m benchmarks.run_all

clean:
	rm -rf $(VENV) build *.egg-info .mypy_cache .pytest_cache .ruff_cache
