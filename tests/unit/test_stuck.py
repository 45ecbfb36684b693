"""One request stuck while the server serves the rest: SGLang's JSON request log (probes/requests.py), judged by
`policies.stuck` through `diagnose`, planned as an abort of that request by `policies.abort`."""

from __future__ import annotations

import json
from typing import Any

import pytest

from policies.abort import abort_first
from policies.diagnose import DiagnoseContext, diagnose
from policies.model import Observation, ProbeSettings
from probes.requests import RequestLedger

pytestmark = pytest.mark.unit
S = ProbeSettings(stuck_request_min_s=60.0)
CTX = DiagnoseContext("serving", "unified", 0.0, S, healthy_once=True)


def line(event: str, rid: str, max_new: int | None = 16, e2e: float = 0.5, tokens: int = 16) -> str:
    """One line of SGLang 0.5.23's JSON request log (level 1), as the real server writes it."""
    data: dict[str, Any] = {"timestamp": "2026-12-05T12:06:50.1", "event": event, "rid": rid}
    data["obj"] = {"rid": rid, "sampling_params": {"max_new_tokens": max_new}, "stream": False}
    if event == "request.finished":
        meta = {
            "id": rid,
            "finish_reason": {"type": "length"},
            "e2e_latency": e2e,
            "completion_tokens": tokens,
        }
        data["out"] = {"meta_info": meta}
    return "[2026-12-05 12:06:50] " + json.dumps(data)


def served(ledger: RequestLedger, n: int, at: float, prefix: str = "p") -> None:
    for i in range(n):
        ledger.observe(
            [line("request.received", f"{prefix}{i}"), line("request.finished", f"{prefix}{i}")], at
        )


def progress(at: float) -> Observation:
    return Observation("progress", at, True, "moving", 0.01, {"work": True, "last_progress_at": at})


def test_the_ledger_keeps_what_is_in_flight_and_the_latency_of_what_finished() -> None:
    ledger = RequestLedger()
    assert (
        ledger.observe(["[2026-12-05 12:00:00] Decode batch, #running-req: 1"], 0.0) is None
    )  # no request log
    ledger.observe([line("request.received", "stuck-1", max_new=8)], 10.0)
    served(ledger, 12, 20.0)
    ledger.observe([line("request.received", "HEALTH_CHECK_abc")], 20.0)  # SGLang's own: left out
    obs = ledger.observe([], 100.0)
    assert obs is not None
    v = obs.values
    assert v["in_flight"] == 1 and v["finished"] == 12 and v["p99_e2e_s"] == 0.5
    assert v["oldest"] == [
        {"rid": "stuck-1", "age_s": 90.0, "max_new_tokens": 8, "finished_since": 12, "aborted_s": None}
    ]
    ledger.observe([line("request.finished", "stuck-1")], 101.0)
    last = ledger.observe([], 102.0)
    assert last is not None and last.values["in_flight"] == 0


def test_a_request_far_past_its_peers_on_a_serving_server_is_aborted_by_its_id() -> None:
    ledger = RequestLedger()
    ledger.observe([line("request.received", "stuck-1")], 0.0)
    served(ledger, 12, 10.0)
    young = ledger.observe([], 50.0)
    assert young is not None and diagnose([young, progress(50.0)], CTX, 50.0) is None  # not yet 60 s
    obs = ledger.observe([], 70.0)
    assert obs is not None
    fault = diagnose([obs, progress(70.0)], CTX, 70.0)
    assert fault is not None and fault.kind == "request_stuck" and fault.evidence["rids"] == ["stuck-1"]
    assert "stuck-1 70s" in fault.reason
    plan = abort_first(fault, {})
    assert plan is not None and plan.action == "abort" and not plan.page


@pytest.mark.parametrize(
    "case",
    [
        "server_stalled",  # no progress: the stall rules judge the server
        "no_peers_finished",  # nothing finished since: not "while the server serves the rest"
        "max_tokens_allow_it",  # its max_tokens at the peers' speed takes longer than its age
    ],
)
def test_no_stuck_request_without_served_peers_progress_and_an_age_past_max_tokens(case: str) -> None:
    ledger = RequestLedger()
    max_new = 100_000 if case == "max_tokens_allow_it" else 16
    ledger.observe([line("request.received", "long-1", max_new=max_new)], 0.0)
    if case != "no_peers_finished":
        served(ledger, 12, 10.0)
    obs = ledger.observe([], 70.0)
    assert obs is not None
    moved = Observation("progress", 70.0, True, "stalled", 0.01, {"work": True, "last_progress_at": 5.0})
    assert diagnose([obs, moved if case == "server_stalled" else progress(70.0)], CTX, 70.0) is None


def test_an_abort_that_does_not_end_it_restarts_the_server() -> None:
    """Aborted and still in flight past the grace: `abort_ineffective`, and no abort plan (a restart)."""
    ledger = RequestLedger()
    ledger.observe([line("request.received", "stuck-1")], 0.0)
    served(ledger, 12, 10.0)
    ledger.note_aborted(["stuck-1"], 70.0)
    waiting = ledger.observe([], 80.0)
    assert (
        waiting is not None and diagnose([waiting, progress(80.0)], CTX, 80.0) is None
    )  # its abort on its way
    obs = ledger.observe([], 101.0)
    assert obs is not None
    fault = diagnose([obs, progress(101.0)], CTX, 101.0)
    assert fault is not None and "abort_ineffective" in fault.evidence["tags"]
    assert abort_first(fault, {}) is None


def test_an_abort_sglang_takes_clears_it() -> None:
    ledger = RequestLedger()
    ledger.observe([line("request.received", "stuck-1")], 0.0)
    served(ledger, 12, 10.0)
    ledger.note_aborted(["stuck-1"], 70.0)
    obs = ledger.observe([line("request.finished", "stuck-1")], 71.0)  # finish reason abort
    assert obs is not None and obs.values["in_flight"] == 0
    assert diagnose([obs, progress(71.0)], CTX, 71.0) is None


def test_a_paused_engine_has_no_stuck_request() -> None:
    ledger = RequestLedger()
    ledger.observe([line("request.received", "stuck-1")], 0.0)
    served(ledger, 12, 10.0)
    obs = ledger.observe([], 70.0)
    assert obs is not None
    pause = Observation("engine", 70.0, True, "paused", 0.01, {"paused": True, "paused_since": 60.0})
    assert diagnose([pause, obs, progress(70.0)], CTX, 70.0) is None
