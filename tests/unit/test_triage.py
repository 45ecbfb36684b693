"""policies.triage: the phase and role rules, the canary gate, the plan — pure, microseconds each."""

from __future__ import annotations

import pytest

from policies.model import Fault, Observation, ProbeSettings
from policies.triage import PlanFacts, ServerFacts, TreeFacts, plan, promotion, spawn_failure, tags, triage

pytestmark = pytest.mark.unit
NOW = 1000.0
S = ProbeSettings()


def obs(probe: str, ok: bool = True, at: float = NOW, **values: object) -> Observation:
    return Observation(probe, at, ok, probe, 0.01, values)


def facts(phase: str = "serving", role: str = "unified", settings: ProbeSettings = S) -> ServerFacts:
    return ServerFacts(role, phase, NOW - 100, settings)


def test_tree_loss_while_starting_before_any_200_is_a_startup_failure() -> None:
    """A death before /health ever answered 200 is a startup failure."""
    result = triage([], TreeFacts(("main_exited 12",), 1), facts("starting"), NOW)
    assert result.fault is not None and result.fault.kind == "startup_failure"


def test_tree_loss_after_a_200_is_a_crash_even_while_starting() -> None:
    """A healthy server that dies is a crash, whatever the canary said."""
    window = [obs("health", status=200)]
    result = triage(window, TreeFacts(("rank_lost sglang::scheduler_TP1",), None), facts("starting"), NOW)
    assert result.fault is not None and result.fault.kind == "crash"


def test_the_dying_trees_log_names_oom_before_the_crash() -> None:
    """The last lines of the dead tree say why: an OOM is `oom`, not a plain crash."""
    tail = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",)
    result = triage([], TreeFacts(("main_exited 12",), 1, tail), facts(), NOW)
    assert result.fault is not None and result.fault.kind == "oom"


def test_starting_ignores_503_and_waits_for_health() -> None:
    """While starting, 503 is normal: no fault, and the triage says what it waits for."""
    window = [obs("health", ok=False, at=NOW - 200 + i, status=503) for i in range(20)]
    result = triage(window, TreeFacts(), facts("starting"), NOW)
    assert result.fault is None and result.waiting_for.startswith("/health 200")


def test_require_gate_opens_on_a_passing_canary() -> None:
    """`require`: /health 200 and a passing tool canary open the gate."""
    window = [obs("health", status=200), obs("canary_tool", verdict="pass")]
    assert triage(window, TreeFacts(), facts("starting"), NOW).serving


def test_require_gate_serves_unproven_after_the_inconclusive_limit() -> None:
    """`require`: the limit of inconclusive canaries with /health 200 serves, with a warning."""
    window = [obs("health", status=200)] + [
        obs("canary_tool", ok=False, at=NOW - i, verdict="inconclusive", reason="finish_reason length")
        for i in range(3)
    ]
    result = triage(window, TreeFacts(), facts("starting"), NOW)
    assert result.serving and "3 inconclusive canaries" in result.unproven
    two = triage(window[:3], TreeFacts(), facts("starting"), NOW)
    assert not two.serving and "2 of 3" in two.waiting_for


@pytest.mark.parametrize("mode", ["advisory", "off"])
def test_advisory_and_off_serve_on_health_alone(mode: str) -> None:
    """`advisory` and `off` open the gate on /health 200."""
    result = triage(
        [obs("health", status=200)],
        TreeFacts(),
        facts("starting", settings=ProbeSettings(canary_mode=mode)),
        NOW,
    )
    assert result.serving and not result.unproven


def test_advisory_parser_failure_alerts_without_restart() -> None:
    """`advisory`: a failing canary while serving is a parser_misconfig whose plan is alert only."""
    settings = ProbeSettings(canary_mode="advisory")
    result = triage(
        [obs("canary_tool", ok=False, verdict="fail")], TreeFacts(), facts(settings=settings), NOW
    )
    assert result.fault is not None and result.fault.kind == "parser_misconfig"
    chosen = plan(result.fault, _facts(canary_mode="advisory"), NOW).plan
    assert chosen.action == "alert" and not chosen.page


def test_a_router_that_never_answers_within_its_startup_budget_is_startup_stalled() -> None:
    """`startup_budget_s` bounds a router's start too: a /health that never answers is a startup_stalled fault."""
    refused = [obs("health", ok=False, at=NOW - i, refused=True) for i in range(5)]
    waiting = ServerFacts("router", "starting", NOW - S.startup_budget_s + 1, S)
    assert triage(refused, TreeFacts(), waiting, NOW).fault is None
    spent = ServerFacts("router", "starting", NOW - S.startup_budget_s, S)
    fault = triage(refused, TreeFacts(), spent, NOW).fault
    assert fault is not None and fault.kind == "startup_stalled" and "budget" in fault.reason


def test_router_is_judged_on_its_liveness_only() -> None:
    """A stalled decode behind the router is not the router's fault."""
    stalled = obs("progress", stalled_s=999.0, work=True, work_reasons=["canary_outstanding"])
    assert triage([stalled], TreeFacts(), facts(role="router"), NOW).fault is None


def test_a_router_is_proven_by_its_canary_through_the_pair() -> None:
    """/health 200 alone does not make a router serving: its canary through the prefill and decode behind it
    must pass; while none of them is up it serves unproven without a warning, as a PD worker waits."""
    health = obs("health", status=200)
    waiting = ServerFacts("router", "starting", NOW - 100, S, awaiting="a prefill and a decode")
    result = triage([health], TreeFacts(), waiting, NOW)
    assert result.serving and result.awaiting_partner
    assert result.unproven == "serving unproven: awaiting a prefill and a decode with /health 200 behind it"
    assert not triage([health], TreeFacts(), facts("starting", role="router"), NOW).serving
    passed = triage(
        [health, obs("canary_tool", verdict="pass")], TreeFacts(), facts("starting", role="router"), NOW
    )
    assert passed.serving and not passed.unproven


def test_a_pair_up_whose_canary_stays_inconclusive_turns_the_wait_into_a_warning() -> None:
    """Served unproven while the pair was not up; the pair is up now and the canary through it fails with the
    decode's own 500 (a router naming a bootstrap port no prefill listens on): the warning says so, once the
    inconclusive limit is reached; a passing canary proves it."""
    reason = "non-stream: HTTP 500: Decode handshake failed for request rank=0 … Aborted by AbortReq."
    failing = [
        obs("canary_tool", ok=False, at=NOW - i, verdict="inconclusive", reason=reason) for i in range(3)
    ]
    for role in ("router", "prefill"):
        waited = ServerFacts(role, "serving", NOW - 100, S, unproven="serving unproven: awaiting a decode …")
        result = triage(failing, TreeFacts(), waited, NOW)
        assert (
            result.unproven.startswith("serving unproven: 3 inconclusive canaries")
            and reason in result.unproven
        )
        waiting = triage(failing[:2], TreeFacts(), waited, NOW).unproven
        assert (
            waiting
            == "serving unproven: awaiting a passing canary through its pair, up now (2 of 3 inconclusive)"
        )
        still = ServerFacts(role, "serving", NOW - 100, S, awaiting="a decode", unproven=waited.unproven)
        assert not triage(failing, TreeFacts(), still, NOW).unproven
        assert triage([obs("canary_tool", verdict="pass")], TreeFacts(), waited, NOW).proven


def test_startup_excludes_faults_that_only_count_when_serving() -> None:
    """While starting, a long /health failure is not `health_unresponsive`."""
    window = [obs("health", ok=False, at=NOW - 300 + 10 * i, status=503) for i in range(30)]
    assert triage(window, TreeFacts(), facts("starting"), NOW).fault is None


def _facts(**kw: object) -> PlanFacts:
    class Restart:
        restarts, window_s, initial_s, factor, max_s, jitter, stable_after_s, slow_retry_s = (
            5,
            600.0,
            5.0,
            2.0,
            300.0,
            0.0,
            600.0,
            1800.0,
        )
        immediate_first = True

    base: dict[str, object] = {
        "role": "unified", "args": (), "restarts": (), "serving_since": None, "restart": Restart(),
        "jitter": 0.5, "history": (), "levels": {}, "ladders": {}, "parser_policy": "fix",
    }  # fmt: skip
    base.update(kw)
    return PlanFacts(**base)  # type: ignore[arg-type]


def test_plan_resets_the_streak_after_stable_serving() -> None:
    """Serving for stable_after_s ends the restart streak before the next plan."""
    fault = Fault("crash", {}, 0.9, "main exited", NOW)
    recovery = plan(fault, _facts(restarts=(NOW - 50, NOW - 40), serving_since=NOW - 700), NOW)
    assert recovery.streak_over and recovery.plan.action == "relaunch"


def test_spec_decode_argv_tags_the_fault() -> None:
    """A speculative-decoding server's faults pick the spec_decode ladder variant."""
    fault = Fault("decode_wedge", {"tags": []}, 0.9, "stalled", NOW)
    assert "spec_decode" in tags(fault, ("--speculative-algorithm=EAGLE",))


def test_promotion_waits_for_quiet_and_stability() -> None:
    """Promote-back only when enabled, on a rung, stable long enough and quiet."""
    levels = {"collective_hang": 1}
    assert promotion(levels, NOW - 10, NOW, quiet=True, enabled=True, after_s=60) is None
    assert promotion(levels, NOW - 100, NOW, quiet=False, enabled=True, after_s=60) is None
    assert promotion(levels, NOW - 100, NOW, quiet=True, enabled=False, after_s=60) is None
    due = promotion(levels, NOW - 100, NOW, quiet=True, enabled=True, after_s=60)
    assert due is not None and due.key == "collective_hang"


def test_stream_leak_is_alert_only_whatever_the_budget_says() -> None:
    """A stream leak is alert-only, even with the restart budget spent."""
    fault = Fault("stream_leak", {}, 0.9, "leak", NOW)
    spent = tuple(NOW - i for i in range(1, 7))
    assert plan(fault, _facts(restarts=spent), NOW).plan.action == "alert"


def test_no_wedge_before_the_first_200_while_starting() -> None:
    """A warmup forward that outlasts the stall window before /health ever said 200 is left to startup_stalled."""
    stalled = obs("progress", stalled_s=999.0, work=True, work_reasons=["num_running_reqs"])
    assert triage([stalled], TreeFacts(), facts("starting"), NOW).fault is None
    after = triage([obs("health", status=200), stalled], TreeFacts(), facts("starting"), NOW)
    assert after.fault is not None and after.fault.kind == "decode_wedge"


def test_a_command_that_cannot_run_is_failed_at_once_whatever_the_restart_budget() -> None:
    """A spawn failure (missing or non-executable command) is planned as `fail`: no relaunch can cure it."""
    fault = spawn_failure(
        "No such file or directory: '/opt/venv/bin/python'", ["/opt/venv/bin/python", "-m"], 5.0
    )
    assert fault.kind == "startup_failure" and fault.evidence["command"] == ["/opt/venv/bin/python"]
    chosen = plan(fault, _facts(), now=10.0).plan
    assert chosen.action == "fail" and chosen.reason.endswith("operator needed")


def test_a_passing_canary_clears_the_alert_only_fault_it_had_found() -> None:
    """While degraded: the newest stream canary passing clears a stream leak, the tool canary a parser failure."""
    leak = obs("canary_stream", ok=False, at=NOW - 60, verdict="fail", leaks=["<tool_call>"])
    clean = obs("canary_stream", at=NOW, verdict="pass")
    still = triage([obs("health", status=200), leak], TreeFacts(), facts("degraded"), NOW)
    assert still.fault is not None and still.fault.kind == "stream_leak" and not still.cleared
    now_clean = triage([obs("health", status=200), leak, clean], TreeFacts(), facts("degraded"), NOW)
    assert now_clean.fault is None and now_clean.cleared == {"stream_leak"}
    tool_ok = triage(
        [obs("health", status=200), obs("canary_tool", verdict="pass")], TreeFacts(), facts(), NOW
    )
    assert "parser_misconfig" in tool_ok.cleared
