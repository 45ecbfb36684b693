"""Issue 23: what clients of the status endpoint do never slows supervision.

Each round SIGKILLs the simulated main process twice: once while a busy process spins one core (the baseline: the
same CPU taken away, no flood) and once while 300 clients loop on `/metrics`, `/status` and `/incidents?limit=500`
(a journal of 500 incidents). The rounds interleave, so a noisy machine weighs on both cases alike; the medians are
compared with slack over the issue's bounds (detection within a few hundred ms, serving again within 1.5x), whose
tight figures are in benchmarks/README.md (`bench_status_flood`). Times come from the journal, not the endpoint.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.hardening.flood import NO_BACKOFF, Busy, Flood, flood_deployment, kill_main
from tests.support.http import http
from tests.support.wait import wait_for

pytestmark = pytest.mark.hardening

ROUNDS = 3
CLIENTS = 300
DETECTION_SLACK_S = 0.5  # the issue asks for a few hundred ms over the baseline
SERVING_RATIO = 2.0  # the issue asks for 1.5x; the rest is room for a shared 2-core machine


def test_a_flooded_status_endpoint_slows_neither_detection_nor_serving_again(
    tmp_path: Path, record_property: Callable[[str, object], None]
) -> None:
    """Main SIGKILLed under a 300-client flood: detection and serving again match a busy-core baseline."""
    busy: list[tuple[float, float]] = []
    flooded: list[tuple[float, float]] = []
    served: dict[int, int] = {}
    with flood_deployment(tmp_path, restart=NO_BACKOFF) as dep:
        dep.start()
        dep.wait(lambda s: s["state"] == "serving", timeout=120, what="serving")
        for _ in range(ROUNDS):
            with Busy():
                busy.append(kill_main(dep))
            with Flood(dep.http_port, clients=CLIENTS) as flood:
                wait_for(lambda: flood.stats.responses >= 200, 60, "the flood under way")
                flooded.append(kill_main(dep))
                health = http(dep.url + "/healthz", timeout=60)
                assert health.status == 200 and health.json()["ok"], health.body
                assert http(dep.url + "/control/pause", "POST", {}, timeout=60).status == 401
            for status, n in flood.stats.by_status.items():
                served[status] = served.get(status, 0) + n
    detect = [statistics.median(d for d, _ in runs) for runs in (busy, flooded)]
    back = [statistics.median(b for _, b in runs) for runs in (busy, flooded)]
    record_property("detection_busy_flooded_s", [round(x, 3) for x in detect])
    record_property("serving_again_busy_flooded_s", [round(x, 3) for x in back])
    assert set(served) == {200} and served[200] > 0, served
    assert detect[1] <= detect[0] + DETECTION_SLACK_S, f"detection busy/flooded {detect}"
    assert back[1] <= SERVING_RATIO * back[0], f"serving again busy/flooded {back}"
