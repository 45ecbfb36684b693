"""No false restart when the host's CPU is saturated: starved processes are slow, not wedged."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.daemon import Traffic, deployment

pytestmark = pytest.mark.e2e

BURN_S = 25.0  # more than one default stall window (stall_after_s 20 s)
BURNER = (
    "import sys, time\nend = time.monotonic() + float(sys.argv[1])\nwhile time.monotonic() < end:\n    pass\n"
)


@contextlib.contextmanager
def saturated_cpu(seconds: float) -> Iterator[None]:
    """More busy-looping processes than cores, each ending by itself after `seconds` (and killed on exit).

    One more than the cores: every core stays busy and the run queue never empties (the test suite's other
    workers add theirs); `benchmarks/bench_false.py` starves the host harder (2 × cores + 2) for longer.
    """
    n = (os.cpu_count() or 1) + 1
    procs = [subprocess.Popen([sys.executable, "-c", BURNER, str(seconds)]) for _ in range(n)]
    try:
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(timeout=10)


def test_busy_server_on_a_saturated_cpu_is_never_restarted(tmp_path: Path) -> None:
    """Requests in flight while every core is saturated for 25 s: no incident, no restart, still serving."""
    with deployment(tmp_path) as dep:
        dep.start()
        first = dep.wait(lambda s: s["state"] == "serving", timeout=120, what="serving")
        with saturated_cpu(BURN_S), Traffic(dep.sim_url, dep.model, period_s=0.2):
            deadline = time.monotonic() + BURN_S
            while time.monotonic() < deadline:
                now = dep.server()
                assert now["last_incident"] is None, now["last_incident"]
                time.sleep(1.0)  # the observation period of a fixed window, not a synchronisation
        after = dep.wait(lambda s: s["state"] == "serving", timeout=30, what="still serving")
        assert after["restarts"] == 0 and after["pid"] == first["pid"]
        assert after["last_incident"] is None
