"""The daemon with the product's DEFAULT probe settings against one real tp-2 SGLang server, shared by this module.

What a user runs: no tuned probes (`/health` every 10 s, metrics every 5 s, `stall_after_s` 20, the canary every
5 min) — but the load canary off: it asks each of its 32 streams for another city, and the scripted model answers
Paris to every prompt (a false `stream_leak`, alert-only, that only this model makes). The tests run in file order
on the same deployment, each starting from `serving` and leaving it serving again (each fault costs one real
relaunch, ~60 s on 2 cores): SGLang's own benchmark client at 8 concurrent streams (no incident, every request
served), an RL client's pause in each mode with requests in flight (no incident, no relaunch), then an idle freeze, a collective hang, a decode wedge, the daemon SIGKILLed and its successor adopting
the tree, and a rank kill, each diagnosed as itself.
"""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from probes.stacks import IDLE, classify, parse_dump
from tests.real_serving.load import ServingLoad
from tests.real_serving.support import (
    NO_LOAD_CANARY,
    READY_S,
    SCRIPTED_REASONING,
    InFlight,
    RealDeployment,
    metric,
    real_deployment,
    serving,
    serving_again,
    wait_running,
)
from tests.support.wait import wait_for


@pytest.fixture(scope="module")
def dep(
    tmp_path_factory: pytest.TempPathFactory, serving_python: Path, models: Path
) -> Iterator[RealDeployment]:
    """The real tp-2 deployment with the family's parsers and the default probe settings, its daemon started."""
    root = tmp_path_factory.mktemp("real-defaults")
    kw = {"tp": 2, "python": serving_python, "models": models, "model_name": SCRIPTED_REASONING}
    with real_deployment(
        root, parsers=("qwen", "qwen3"), tuned_probes=False, probes=NO_LOAD_CANARY, **kw
    ) as d:
        d.start()
        yield d


def test_sglang_benchmark_client_at_8_concurrent_is_served_with_no_incident(
    dep: RealDeployment, serving_python: Path
) -> None:
    """The tp-2 server proven (ranks titled TP0/TP1, config check, reasoning and tool canaries pass); then
    `sglang.benchmark.serving` (random ids, 8 concurrent, 32 requests): every request served, no incident."""
    first = dep.wait(serving, timeout=READY_S, what="serving")
    probes = first["probes"]["probes"]
    for name in ("config_check", "canary_reasoning", "canary_tool"):
        assert probes[name]["values"]["verdict"] == "pass", probes[name]
    assert dep.ranks(first["pid"]).keys() >= {
        "sglang::scheduler_TP0",
        "sglang::scheduler_TP1",
        "sglang::detokenizer",
    }
    assert first["restarts"] == 0
    incidents = len(dep.incidents())
    load = ServingLoad(serving_python, dep.sim_url, dep.model_dir, dep.root / "load.jsonl").start()
    try:
        result = load.wait(timeout_s=900)
    finally:
        load.stop()
    assert result["failed"] == 0 and result["completed"] == result["requests"], result
    after = dep.server()
    assert after["state"] == "serving" and after["pid"] == first["pid"]
    assert len(dep.incidents()) == incidents, dep.incidents()[incidents:]


PAUSE_HELD_S = 30.0  # past stall_after_s (20 s: the false decode_wedge at 21 s) and its strong quarter (5 s)


def _post(base_url: str, path: str, body: dict[str, Any]) -> int:
    req = urllib.request.Request(
        base_url + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=120) as resp:
        return int(resp.status)


@pytest.mark.parametrize("mode", ["abort", "retract", "in_place"])
def test_a_pause_by_its_rl_client_with_requests_in_flight_is_no_incident(
    dep: RealDeployment, mode: str
) -> None:
    """Two requests decoding, `/pause_generation` in `mode` held 30 s, `/continue_generation`: the engine seen
    paused (SGLang's /ready 503), no incident, same PID and rung (the real server was killed at 21 s as a
    decode_wedge, or at 12.8 s as a collective_hang, before the pause was understood)."""
    first = dep.wait(serving, timeout=READY_S, what="serving")
    incidents = len(dep.incidents())
    with InFlight(dep.sim_url, n=2, tokens=300):
        wait_running(dep.sim_url, 1, timeout=300)
        assert _post(dep.sim_url, "/pause_generation", {"mode": mode}) == 200
        seen = dep.wait(lambda s: s["engine"] is not None, timeout=30, what="the pause seen")
        held_until = time.monotonic() + PAUSE_HELD_S
        while time.monotonic() < held_until:
            assert len(dep.incidents()) == incidents, dep.incidents()[incidents:]
            time.sleep(2)
        assert dep.server()["engine"]["paused_s"] >= PAUSE_HELD_S - 5
        assert _post(dep.sim_url, "/continue_generation", {}) == 200
        after = dep.wait(lambda s: s["engine"] is None and serving(s), timeout=60, what="the pause over")
        wait_for(lambda: generating_requests(dep.sim_url) == 0, READY_S, "the paused requests done")
    assert seen["pid"] == after["pid"] == first["pid"] and after["restarts"] == first["restarts"]
    assert after["fallback"]["rung"] == first["fallback"]["rung"]
    assert len(dep.incidents()) == incidents, dep.incidents()[incidents:]


def generating_requests(base_url: str) -> float:
    """Requests in flight at the server's generation endpoint (its HTTP gauge; the scrape itself not counted)."""
    with urllib.request.urlopen(base_url + "/metrics", timeout=30) as resp:
        text = resp.read().decode()
    series = [ln for ln in text.splitlines() if ln.startswith("sglang:http_requests_active{")]
    return sum(float(ln.rsplit(" ", 1)[1]) for ln in series if 'endpoint="/generate"' in ln)


def idle(dep: RealDeployment) -> dict[str, Any]:
    """Serving, no canary of ours in flight and nothing running."""

    def quiet() -> bool:
        s = dep.server()
        ours = {"canary_tool", "canary_stream"} & set((s.get("probes") or {}).get("in_flight", ()))
        return serving(s) and not ours and metric(dep.sim_url, "sglang:num_running_reqs") == 0

    wait_for(quiet, READY_S, "serving and idle", interval=0.5)
    return dep.server()


def test_every_rank_of_the_idle_server_stopped_is_health_unresponsive_on_frozen_ranks(
    dep: RealDeployment,
) -> None:
    """Idle, every rank SIGSTOPped (a GPU hang's shape): health_unresponsive on the first failed /health, the
    ranks' `T` state as evidence; relaunched and serving."""
    first = idle(dep)
    for proc in dep.ranks(first["pid"]).values():
        proc.suspend()
    again = serving_again(dep, first["pid"], "relaunched after the idle freeze")
    incident = again["last_incident"]
    assert incident["fault"] == "health_unresponsive", incident
    evidence = incident["evidence"]
    assert "ranks_frozen" in evidence["tags"] and evidence["health"]["statuses"] == [503], evidence
    # which ranks count as frozen "throughout" depends on where the failing /health began (the first rank seen
    # frozen starts one at once); every scheduler is stopped (`T`) in the newest reading either way
    states = evidence["ranks"]["states"]
    assert evidence["ranks"]["frozen"] and {states[t] for t in states if "scheduler" in t} == {"T"}, evidence


def test_rank_stopped_mid_request_is_a_collective_hang_naming_the_gloo_collective(
    dep: RealDeployment,
) -> None:
    """SIGSTOP of scheduler_TP1 with a request decoding: TP0 waits in a gloo collective → collective_hang with
    that collective in the evidence, relaunched."""
    first = dep.wait(serving, timeout=READY_S, what="serving")
    with InFlight(dep.sim_url, n=1):
        wait_running(dep.sim_url, 1, timeout=300)
        dep.ranks(first["pid"])["sglang::scheduler_TP1"].suspend()
        again = serving_again(dep, first["pid"], "relaunched after the hang")
    incident = again["last_incident"]
    assert incident["fault"] == "collective_hang", incident
    tp0 = (Path(incident["forensics_path"]) / "stack-sglang_scheduler_TP0.txt").read_text()
    collective, _ = classify(parse_dump(tp0)[0])
    assert collective is not None and collective != IDLE, f"py-spy shows TP0 blocked in a collective:\n{tp0}"
    assert collective in json.dumps(incident["evidence"]), (collective, incident["evidence"])


def test_all_ranks_stopped_with_requests_in_flight_is_a_decode_wedge(dep: RealDeployment) -> None:
    """Requests decoding, every rank SIGSTOPped: no token progress for stall_after_s → decode_wedge, relaunched."""
    first = dep.wait(serving, timeout=READY_S, what="serving")
    with InFlight(dep.sim_url, n=2):
        wait_running(dep.sim_url, 1, timeout=300)
        for proc in dep.ranks(first["pid"]).values():
            proc.suspend()
        again = serving_again(dep, first["pid"], "relaunched after the wedge")
    incident = again["last_incident"]
    assert incident["fault"] == "decode_wedge", incident
    assert incident["rung"] >= 1 and "--disable-overlap-schedule" in again["argv"]


def test_a_sigkilled_daemon_is_followed_by_one_that_adopts_the_tree_and_a_rank_kill_is_a_crash(
    dep: RealDeployment,
) -> None:
    """The daemon SIGKILLed while the server serves: the next daemon adopts the same tree (its main PID, no
    incident). SIGKILL of scheduler_TP1 then: a crash with the lost rank in the evidence, the relaunch spawned (the
    module's last test: the relaunch's own start is not waited for — the other modules prove relaunches serve)."""
    first = dep.wait(serving, timeout=READY_S, what="serving")
    incidents = len(dep.incidents())
    assert dep.daemon is not None
    os.killpg(dep.daemon.pid, signal.SIGKILL)
    dep.daemon.wait(timeout=30)
    dep.start()
    adopted = dep.wait(lambda s: serving(s) and bool(s["adopted"]), timeout=READY_S, what="adopted")
    assert adopted["pid"] == first["pid"] and len(dep.incidents()) == incidents
    dep.ranks(first["pid"])["sglang::scheduler_TP1"].kill()
    after = dep.wait(
        lambda s: s["pid"] not in (None, first["pid"]) and bool(s["last_incident"]),
        timeout=READY_S,
        what="the relaunch spawned after the rank kill",
    )
    incident = after["last_incident"]
    assert incident["fault"] == "crash" and "scheduler_TP1" in json.dumps(incident["evidence"]), incident
    assert not after["adopted"]
