"""A deliberate engine pause (SGLang's own word: /ready, /ping, its answered control calls) holds the lease, masks
the lease rules and becomes a `pause_overrun` only past `max_pause_s`; a paused scheduler's stack is no collective."""

from __future__ import annotations

import pytest

from policies.diagnose import DiagnoseContext, diagnose
from policies.model import Observation, ProbeSettings
from policies.triage import ServerFacts, TreeFacts, triage
from probes.engine import EngineTracker
from probes.progress import ProgressTracker, Sample, parse_metrics
from probes.stacks import classify

pytestmark = pytest.mark.unit
S = ProbeSettings()
NOW = 5000.0


def calls(pause: float = 0, cont: float = 0, release: float = 0, resume: float = 0) -> list[Sample]:
    text = "\n".join(
        f'sglang:http_responses_total{{endpoint="{ep}",status_code="200",method="POST"}} {n}'
        for ep, n in (
            ("/pause_generation", pause),
            ("/continue_generation", cont),
            ("/release_memory_occupation", release),
            ("/resume_memory_occupation", resume),
        )
    )
    return parse_metrics(
        text + '\nsglang:http_responses_total{endpoint="/pause_generation",status_code="422"} 9'
    )


def paused(at: float, since: float) -> Observation:
    return Observation(
        "engine", at, True, "paused", 0.01, {"paused": True, "paused_since": since, "ready": 503}
    )


def stalled(seconds: float, at: float = NOW) -> Observation:
    values = {"work": True, "stalled_s": seconds, "work_reasons": ["generation_requests_active"]}
    return Observation("progress", at, True, "stalled", 0.01, values)


def test_ready_503_with_ping_200_is_a_pause_and_ready_200_never_is() -> None:
    """SGLang's is_ready() = not paused and healthy, /ping = healthy: only that pair says paused."""
    t = EngineTracker()
    assert t.update(calls(), 200, None, 1.0).values["paused"] is False
    first = t.update(calls(), 503, 200, 2.0)
    assert first.values["paused"] and first.values["paused_since"] == 2.0
    assert t.update(calls(), 503, 200, 9.0).values["paused_since"] == 2.0
    assert t.update(calls(), 503, 503, 10.0).values["paused"] is False  # unhealthy, no pause call seen
    assert t.update(calls(pause=5), 200, None, 11.0).values["paused"] is False


def test_a_pause_call_newer_than_a_continue_holds_the_pause_after_a_failed_health() -> None:
    """/ping turns 503 once a /health failed during the pause; the answered /pause_generation still says paused;
    the 422 of a bad mode is not a pause; a continue ends it; both within one scrape leave it to /ready."""
    t = EngineTracker()
    t.update(calls(pause=1, cont=1), 200, None, 1.0)
    assert t.update(calls(pause=2, cont=1), 503, 503, 2.0).values["paused"] is True
    assert t.update(calls(pause=2, cont=2), 503, 503, 3.0).values["paused"] is False
    assert t.update(calls(pause=3, cont=3), 503, 503, 4.0).values["paused"] is False
    released = t.update(calls(pause=4, cont=3, release=1), 503, 200, 5.0)
    assert released.values["memory_released"] and released.values["calls"]["pause"] == 4


def test_the_first_scrape_of_an_adopted_run_counts_the_calls() -> None:
    """Adopted mid-pause: more pauses than continues answered so far is a pause pending."""
    assert EngineTracker().update(calls(pause=3, cont=2), 503, 503, 1.0).values["paused"] is True
    assert EngineTracker().update(calls(pause=3, cont=3), 503, 503, 1.0).values["paused"] is False


def test_a_paused_engine_holds_the_lease_and_its_pd_clock() -> None:
    """While paused, no stall accrues; after the pause the engine has a whole stall window."""
    p = ProgressTracker("decode")
    p.reset(0.0)
    busy = parse_metrics(
        'sglang:http_requests_active{endpoint="/generate",method="POST"} 2\n'
        "sglang:num_decode_transfer_queue_reqs 1\n"
    )
    p.update(busy, 1.0)
    held = p.update(busy, 100.0, paused=True)
    assert held.values["stalled_s"] == 0.0 and held.values["pd_stalled_s"] == 0.0
    assert p.update(busy, 105.0).values["stalled_s"] == 5.0


def test_paused_masks_the_lease_rules_but_not_a_crash() -> None:
    """A stall, a blocking-collective stack and a failing /health while paused: no fault; a lost rank: crash."""
    ctx = DiagnoseContext("serving", "unified", 0.0, S, healthy_once=True)
    stacks = Observation(
        "stacks", NOW, True, "all in broadcast", 1.0, {"ranks": {}, "all_in": "broadcast", "diverging": False}
    )
    failing = [
        Observation("health", NOW - 200 + 20 * i, False, "/health 503", 20.0, {"status": 503})
        for i in range(8)
    ]
    window = [paused(NOW, NOW - 300), stalled(300.0), stacks, *failing]
    assert diagnose(window, ctx, NOW) is None
    assert diagnose([*window[1:]], ctx, NOW) is not None  # the same evidence without the pause is a fault
    lost = Observation(
        "ranks", NOW, False, "lost", 0.0, {"main_alive": True, "missing": ["sglang::scheduler_TP0"]}
    )
    fault = diagnose([*window, lost], ctx, NOW)
    assert fault is not None and fault.kind == "crash"


def test_a_pause_past_max_pause_s_is_a_pause_overrun_and_clears_when_it_ends() -> None:
    """At max_pause_s: `pause_overrun` (alert only); an engine no longer paused clears it."""
    settings = ProbeSettings(max_pause_s=600)
    ctx = DiagnoseContext("serving", "unified", 0.0, settings, healthy_once=True)
    assert diagnose([paused(NOW, NOW - 599)], ctx, NOW) is None
    fault = diagnose([paused(NOW, NOW - 601), stalled(601.0)], ctx, NOW)
    assert fault is not None and fault.kind == "pause_overrun" and "max_pause_s 600" in fault.reason
    facts = ServerFacts("unified", "degraded", 0.0, settings)
    over = Observation("engine", NOW + 1, True, "/ready 200", 0.01, {"paused": False, "ready": 200})
    assert "pause_overrun" in triage([over], TreeFacts(), facts, NOW + 1).cleared


@pytest.mark.parametrize(
    ("frames", "expected"),
    [
        (
            [
                "broadcast_pyobj (sglang/srt/utils.py:1)",
                "_broadcast_reqs_across_ranks (r.py:170)",
                "recv_requests (r.py:120)",
                "ingest_requests (s.py:9)",
                "event_loop_overlap (s.py:2078)",
            ],
            "recv_requests",
        ),
        (
            [
                "is_fully_idle (s.py:5520)",
                "_record_scheduler_state_for_paused_engine (s.py:5332)",
                "event_loop_overlap (s.py:2080)",
            ],
            "paused",
        ),
        (["all_reduce (d.py:1)", "forward (m.py:2)", "event_loop_overlap (s.py:2090)"], "all_reduce"),
        (
            [
                "all_reduce (torch/distributed/distributed_c10d.py:2800)",
                "poll_and_all_reduce (sglang/srt/disaggregation/utils.py:312)",
                "pop_preallocated (sglang/srt/disaggregation/decode.py:1143)",
                "process_decode_queue (sglang/srt/disaggregation/decode.py:3470)",
            ],
            "pd_poll",
        ),
    ],
)
def test_a_paused_or_receiving_scheduler_is_no_blocking_collective(frames: list[str], expected: str) -> None:
    """The paused loop, the request intake's broadcast and a PD worker's poll of its transfers are where the
    scheduler is, not a collective hang."""
    assert classify(frames)[0] == expected
