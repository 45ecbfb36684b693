"""An engine paused by its client (an RL weight update) is not a wedge: no incident, no restart, no rung stepped;
the canaries stand aside; a pause past `max_pause_s` is a `pause_overrun` alert; the supervisor's own resume acts
only on what is still true."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import urllib.request
from http.client import HTTPException
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.support.daemon import Deployment, deployment
from tests.support.http import http
from tests.support.wait import wait_for

pytestmark = pytest.mark.e2e
SLOW_STEPS = {"SGLANG_SIM_STEP_S": "0.05"}  # 20 tokens/s: a 600-token stream is still running when paused


def serving(s: dict[str, Any]) -> bool:
    return s["state"] == "serving"


def faults(dep: Deployment) -> list[dict[str, Any]]:
    """The journal's entries that are not an operator's action."""
    journal = dep.root / "state" / "incidents.jsonl"
    lines = journal.read_text().splitlines() if journal.exists() else []
    return [e for e in map(json.loads, lines) if e["fault"] != "operator"]


def metric(dep: Deployment, prefix: str) -> float:
    text = http(dep.url + "/metrics").body.decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(prefix))


class Streams:
    """`n` streamed /generate requests of `tokens` tokens each, in threads; what each ended with."""

    def __init__(self, url: str, n: int, tokens: int) -> None:
        self.url, self.tokens = url, tokens
        self.ends: list[str] = []
        self.threads = [threading.Thread(target=self._one, daemon=True) for _ in range(n)]
        for thread in self.threads:
            thread.start()

    def _one(self) -> None:
        body = {"text": "Once", "sampling_params": {"max_new_tokens": self.tokens, "ignore_eos": True}}
        body["stream"] = True
        req = urllib.request.Request(
            self.url + "/generate", json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(req, timeout=600) as resp:
                self.ends.append("done" if b"[DONE]" in resp.read() else "cut")
        except (OSError, ValueError, HTTPException) as exc:  # refused, reset, or cut mid-stream
            self.ends.append(f"error {exc!r}")

    def join(self, timeout: float) -> list[str]:
        deadline = time.monotonic() + timeout
        for thread in self.threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return self.ends


def generating(dep: Deployment) -> bool:
    """Tokens are moving now (two scrapes of the decode counter apart)."""
    before = _decode_tokens(dep)
    return wait_for(lambda: _decode_tokens(dep) > before, 10, "tokens") is not None


def _decode_tokens(dep: Deployment) -> float:
    text = http(dep.sim_url + "/metrics").body.decode()
    lines = [
        ln for ln in text.splitlines() if ln.startswith("sglang:realtime_tokens_total") and "decode" in ln
    ]
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines)


def test_a_three_minute_in_place_pause_under_load_is_no_incident(tmp_path: Path) -> None:
    """Streams in flight, `in_place` pause for 3 minutes (past the stall, strong-stall and unresponsive windows),
    a request arriving during it: no incident, same PID, rung 0; `/status` and readiness say paused; no canary
    or /health is sent while paused and both run after; every stream completes after `/continue_generation`."""
    probes = {"canary_period_s": 30, "stream_canary_period_s": 60, "stream_canary_first_s": 5}
    with deployment(tmp_path, env=SLOW_STEPS, probes=probes) as dep:
        dep.start()
        first = dep.wait(serving, timeout=120, what="serving")
        dep.wait(lambda s: "canary_stream" in s["probes"]["probes"], timeout=90, what="the first load canary")
        streams = Streams(dep.sim_url, 4, 700)
        assert generating(dep)
        status, body = dep.post("/pause_generation", {"mode": "in_place"}, base=dep.sim_url)
        assert (status, body["status"]) == (200, "ok")
        paused = dep.wait(lambda s: s["engine"] is not None, timeout=15, what="the pause seen")
        assert paused["state"] == "serving"
        ready = http(dep.url + f"/servers/{dep.name}/ready")
        assert ready.status == 503 and b"engine paused by its client" in ready.body
        assert metric(dep, 'sglang_supervisor_engine_paused{server="sim"}') == 1.0
        late = Streams(dep.sim_url, 1, 20)  # arrives during the pause: waits before the scheduler
        canaries = metric(dep, 'sglang_supervisor_probe_results_total{probe="canary_tool"')
        health = metric(dep, 'sglang_supervisor_probe_results_total{probe="health"')
        pause_until = time.monotonic() + 180
        while time.monotonic() < pause_until:
            assert faults(dep) == [], faults(dep)
            time.sleep(5)
        during = dep.server()
        assert during["engine"]["paused_s"] >= 170 and during["pid"] == first["pid"]
        assert metric(dep, 'sglang_supervisor_probe_results_total{probe="canary_tool"') == canaries
        assert metric(dep, 'sglang_supervisor_probe_results_total{probe="health"') <= health + 1
        assert dep.post("/continue_generation", {}, base=dep.sim_url)[0] == 200
        assert streams.join(120) == ["done"] * 4 and late.join(60) == ["done"]
        after = dep.wait(lambda s: s["engine"] is None, timeout=15, what="the pause over")
        wait_for(
            lambda: metric(dep, 'sglang_supervisor_probe_results_total{probe="canary_tool"') > canaries,
            60,
            "a canary after the pause",
        )
        assert after["pid"] == first["pid"] and after["restarts"] == 0 and after["fallback"]["rung"] == 0
        assert faults(dep) == []


@pytest.mark.parametrize("mode", ["abort", "retract"])
def test_abort_and_retract_pauses_with_requests_in_flight_are_no_incident(tmp_path: Path, mode: str) -> None:
    """`abort` ends the streams (SGLang's own answer), `retract` keeps them queued; paused 60 s at a 5 s stall
    window and a 2 s /health period: no incident, no restart; retracted streams complete after continue."""
    probes = {"stall_after_s": 5, "health_period_s": 2, "metrics_period_s": 1}
    with deployment(tmp_path, env=SLOW_STEPS, probes=probes) as dep:
        dep.start()
        first = dep.wait(serving, timeout=120, what="serving")
        streams = Streams(dep.sim_url, 3, 700)
        assert generating(dep)
        assert dep.post("/pause_generation", {"mode": mode}, base=dep.sim_url)[0] == 200
        dep.wait(lambda s: s["engine"] is not None, timeout=15, what="the pause seen")
        pause_until = time.monotonic() + 60
        while time.monotonic() < pause_until:
            assert faults(dep) == [], faults(dep)
            time.sleep(2)
        assert dep.post("/continue_generation", {}, base=dep.sim_url)[0] == 200
        assert streams.join(120) == ["done"] * 3  # abort: the streams end at once, each with [DONE]
        after = dep.wait(lambda s: s["engine"] is None, timeout=15, what="the pause over")
        assert after["pid"] == first["pid"] and after["restarts"] == 0 and faults(dep) == []


def test_a_pause_past_max_pause_s_is_a_pause_overrun_alert_not_a_restart(tmp_path: Path) -> None:
    """Paused past `max_pause_s`: one `pause_overrun` incident (alert, degraded), nothing killed; continue:
    serving again, the incident resolved."""
    with deployment(tmp_path, probes={"max_pause_s": 8}) as dep:
        dep.start()
        first = dep.wait(serving, timeout=120, what="serving")
        assert dep.post("/pause_generation", {"mode": "retract"}, base=dep.sim_url)[0] == 200
        over = dep.wait(lambda s: s["state"] == "degraded", timeout=60, what="pause_overrun")
        incident = over["last_incident"]
        assert incident["fault"] == "pause_overrun" and incident["action"] == "alert", incident
        assert "max_pause_s 8" in incident["reason"] and over["pid"] == first["pid"]
        assert dep.post("/continue_generation", {}, base=dep.sim_url)[0] == 200
        again = dep.wait(serving, timeout=30, what="serving again")
        assert again["pid"] == first["pid"] and again["restarts"] == 0
        assert {e["fault"] for e in faults(dep)} == {"pause_overrun"}
        assert again["last_incident"]["recovered_at"] is not None


def test_resume_acts_only_on_what_is_still_true(tmp_path: Path) -> None:
    """Supervisor paused; a scheduler stopped under load is observed (paused), then continued: the tokens flow
    again, and `resume` restarts nothing (the fault seen during the pause is not replayed)."""
    with deployment(tmp_path, env=SLOW_STEPS, probes={"stall_after_s": 5}) as dep:
        dep.start()
        first = dep.wait(serving, timeout=120, what="serving")
        status, _ = dep.post("/control/pause", {"server": "sim", "reason": "rl sync"}, token=dep.token)
        assert status == 200
        dep.wait(lambda s: s["state"] == "paused", what="paused")
        Streams(dep.sim_url, 2, 2000)
        assert generating(dep)
        rank = next(
            c
            for c in psutil.Process(first["pid"]).children(recursive=True)
            if "scheduler_TP1" in " ".join(c.cmdline())
        )
        os.kill(rank.pid, signal.SIGSTOP)
        dep.wait(
            lambda s: (s["last_incident"] or {}).get("action") == "observed (paused)",
            timeout=60,
            what="observed",
        )
        os.kill(rank.pid, signal.SIGCONT)
        assert generating(dep)
        assert dep.post("/control/resume", {"server": "sim", "reason": "done"}, token=dep.token)[0] == 200
        again = dep.wait(serving, timeout=30, what="serving after resume")
        assert generating(dep)
        assert again["pid"] == first["pid"] and again["restarts"] == 0
        assert [e["action"] for e in faults(dep)] == ["observed (paused)"]
