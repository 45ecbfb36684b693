"""diagnose(): observations → the fault kind of docs/contracts.md, by the documented precedence."""

from __future__ import annotations

from typing import Any

import pytest

from policies.diagnose import DiagnoseContext, diagnose
from policies.model import Observation, ProbeSettings

S = ProbeSettings()
NOW = 1000.0


def ctx(phase: str = "serving", role: str = "unified", started_at: float = 0.0) -> DiagnoseContext:
    return DiagnoseContext(phase, role, started_at, S)


def obs(
    probe: str, ok: bool = True, at: float = NOW, latency: float | None = None, **values: Any
) -> Observation:
    return Observation(probe, at, ok, f"{probe} test", latency, values)


def kind_of(window: list[Observation], c: DiagnoseContext, now: float) -> str | None:
    fault = diagnose(window, c, now)
    return fault.kind if fault else None


def stalled(seconds: float, **extra: Any) -> Observation:
    values: dict[str, Any] = {
        "stalled_s": seconds,
        "work_reasons": ["generation_requests_active"],
        "last_progress_at": NOW - seconds,
        "pd_stalled_s": 0.0,
    }
    values.update(extra)
    return obs("progress", **values)


def logs(*hits: tuple[str, str, str], at: float = NOW) -> Observation:
    return obs("logs", at=at, hits=[{"name": "x", "kind": k, "tag": t, "line": line} for k, t, line in hits])


def ranks(main: bool = True, missing: tuple[str, ...] = (), zombie: tuple[str, ...] = ()) -> Observation:
    return obs("ranks", main_alive=main, missing=list(missing), zombie=list(zombie))


def stacks(frames: dict[str, str], at: float = NOW) -> Observation:
    collectives = set(frames.values())
    return obs(
        "stacks",
        at=at,
        ranks={t: {"collective": c} for t, c in frames.items()},
        diverging=len(collectives) > 1,
        all_in=next(iter(collectives)) if len(collectives) == 1 else None,
    )


def test_quiet_window_is_no_fault() -> None:
    """Healthy probes diagnose nothing."""
    window = [obs("health", status=200), stalled(0.0), ranks(), obs("canary_tool", verdict="pass")]
    assert diagnose(window, ctx(), NOW) is None


def test_fatal_xid_is_gpu_fault_above_everything() -> None:
    """Xid 79 wins over a crash line and a stall."""
    window = [
        obs("gpu", ok=False, xids=[{"index": 3, "xid": 79, "at": 1.0}], spin=[]),
        logs(("crash", "", "Scheduler hit an exception:")),
        stalled(60.0),
    ]
    fault = diagnose(window, ctx(), NOW)
    assert fault is not None and fault.kind == "gpu_fault"


def test_oom_line_beats_the_crash_that_follows() -> None:
    """CUDA OOM then the fail-stop teardown is `oom`."""
    window = [
        logs(
            ("crash", "", "Scheduler hit an exception:"),
            ("oom", "", "torch.OutOfMemoryError: CUDA out of memory"),
        )
    ]
    fault = diagnose(window, ctx(), NOW)
    assert fault is not None and fault.kind == "oom"


def test_missing_rank_with_main_alive_is_crash() -> None:
    """F10: a scheduler rank gone while the HTTP server lives on."""
    fault = diagnose([ranks(missing=("sglang::scheduler_TP1",))], ctx(), NOW)
    assert fault is not None and fault.kind == "crash"
    assert fault.evidence["ranks"]["missing"] == ["sglang::scheduler_TP1"]


def test_a_rank_lost_while_starting_is_a_startup_failure() -> None:
    """A rank that had appeared and is gone before /health ever said 200 is a startup failure."""
    window = [ranks(missing=("sglang::scheduler_TP0",))]
    assert kind_of(window, ctx("starting", started_at=NOW), NOW) == "startup_failure"


def test_crash_while_starting_is_startup_failure() -> None:
    """A fail-stop line before serving is a startup failure; an IMA carries its ladder tag."""
    window = [
        logs(("crash", "illegal_memory_access", "CUDA error: an illegal memory access was encountered"))
    ]
    assert kind_of(window, ctx("starting", started_at=NOW), NOW) == "startup_failure"
    fault = diagnose(window, ctx(), NOW)
    assert fault is not None and fault.kind == "crash" and fault.evidence["tags"] == ["illegal_memory_access"]


def test_startup_death_lines() -> None:
    """A port collision or /dev/shm bus error is startup_failure with its tag."""
    fault = diagnose(
        [logs(("startup_failure", "dev_shm", "Fatal Python error: Bus error"))], ctx("starting"), NOW
    )
    assert fault is not None and fault.kind == "startup_failure" and fault.evidence["tags"] == ["dev_shm"]


def test_diverging_stacks_during_a_stall_are_collective_hang() -> None:
    """F1: ranks in different collectives with no progress → collective_hang naming each rank."""
    window = [stalled(25.0), stacks({"TP0": "broadcast", "TP1": "all_reduce"}, at=NOW - 5)]
    fault = diagnose(window, ctx(), NOW)
    assert fault is not None and fault.kind == "collective_hang"
    assert fault.evidence["stacks"] == {
        "TP0": {"collective": "broadcast"},
        "TP1": {"collective": "all_reduce"},
    }


def test_stacks_from_before_the_stall_are_ignored() -> None:
    """Stacks taken before the stall began say nothing about it: plain decode_wedge."""
    window = [stalled(25.0), stacks({"TP0": "broadcast", "TP1": "all_reduce"}, at=NOW - 100)]
    assert kind_of(window, ctx(), NOW) == "decode_wedge"


def test_all_ranks_idle_in_recv_requests_is_not_collective() -> None:
    """Every rank waiting for work while requests stall points at the main process: decode_wedge."""
    window = [stalled(25.0), stacks({"TP0": "recv_requests", "TP1": "recv_requests"})]
    assert kind_of(window, ctx(), NOW) == "decode_wedge"


def test_all_ranks_in_one_collective_is_collective_hang() -> None:
    """Every rank spinning in custom_all_reduce with no progress is a collective hang."""
    window = [stalled(25.0), stacks({"TP0": "custom_all_reduce", "TP1": "custom_all_reduce"})]
    assert kind_of(window, ctx(), NOW) == "collective_hang"


def test_gpu_spin_with_stall_is_collective_hang() -> None:
    """High utilisation at idle power with no progress is the spin signature."""
    window = [stalled(25.0), obs("gpu", spin=[0, 1, 2], xids=[])]
    fault = diagnose(window, ctx(), NOW)
    assert fault is not None and fault.kind == "collective_hang" and fault.evidence["gpu_spin"] == [0, 1, 2]


def test_gpu_spin_without_stall_is_nothing() -> None:
    """Spin evidence alone (progress moving) is not a fault."""
    assert diagnose([stalled(0.0), obs("gpu", spin=[0], xids=[])], ctx(), NOW) is None


def test_stall_below_threshold_is_nothing() -> None:
    """Work waiting less than stall_after_s is not yet a wedge."""
    assert diagnose([stalled(S.stall_after_s - 1)], ctx(), NOW) is None


def test_stall_is_decode_wedge() -> None:
    """Work in flight with no token progress for stall_after_s is decode_wedge."""
    fault = diagnose([stalled(S.stall_after_s + 1)], ctx(), NOW)
    assert fault is not None and fault.kind == "decode_wedge"


def test_pd_queue_stuck_on_decode_is_pd_transfer_wedge() -> None:
    """Decode role: a transfer queue that neither drains nor decodes is pd_transfer_wedge."""
    window = [stalled(30.0, pd_queue=3.0, pd_stalled_s=30.0)]
    assert kind_of(window, ctx(role="decode"), NOW) == "pd_transfer_wedge"
    assert kind_of(window, ctx(role="prefill"), NOW) == "decode_wedge"


def prefill(idle_at: float | None = NOW, ok: bool = True, stalled_s: float = 0.0) -> Observation:
    """A prefill's progress reading, last idle at `idle_at` (None: busy all along), its own work stalled
    `stalled_s`."""
    return obs("progress", ok=ok, idle_at=idle_at, stalled_s=stalled_s)


def pd_ctx(*prefills: Observation | None) -> DiagnoseContext:
    return DiagnoseContext("serving", "decode", 0.0, S, True, prefills)


def test_pd_queue_stuck_with_every_prefill_idle_is_a_wedge_after_a_quarter_of_the_window() -> None:
    """The KV the decode waits for is not coming when every prefill sat idle since the queue froze: 5 s, not 20."""
    early = S.stall_after_s / 4 + 1
    window = [stalled(early, pd_queue=2.0, pd_stalled_s=early)]
    fault = diagnose(window, pd_ctx(prefill(), prefill()), NOW)
    assert fault is not None and fault.kind == "pd_transfer_wedge" and fault.evidence["prefills_idle"] is True
    assert "every prefill idle" in fault.reason


@pytest.mark.parametrize(
    "prefills",
    [
        pytest.param((), id="no prefill known"),
        pytest.param((prefill(idle_at=None),), id="prefill busy all along with a long prompt"),
        pytest.param((prefill(idle_at=NOW - 30),), id="prefill last idle before the freeze"),
        pytest.param((prefill(), prefill(idle_at=None)), id="one of two prefills busy"),
    ],
)
def test_pd_queue_stuck_without_idle_prefills_waits_the_full_window(
    prefills: tuple[Observation | None, ...],
) -> None:
    """A busy, unseen or unserving prefill may still send the KV: weak evidence waits the whole stall_after_s."""
    early = S.stall_after_s / 4 + 1
    assert kind_of([stalled(early, pd_queue=2.0, pd_stalled_s=early)], pd_ctx(*prefills), NOW) is None
    late = S.stall_after_s + 1
    fault = diagnose([stalled(late, pd_queue=2.0, pd_stalled_s=late)], pd_ctx(*prefills), NOW)
    assert (
        fault is not None and fault.kind == "pd_transfer_wedge" and fault.evidence["prefills_idle"] is False
    )


@pytest.mark.parametrize(
    "prefills",
    [
        pytest.param((None,), id="prefill not serving"),
        pytest.param((prefill(), prefill(ok=False)), id="one prefill's metrics unreadable"),
        pytest.param((prefill(idle_at=None, stalled_s=S.stall_after_s / 4),), id="prefill stalled"),
    ],
)
def test_a_decode_waiting_for_kv_from_a_prefill_in_trouble_is_not_its_own_fault(
    prefills: tuple[Observation | None, ...],
) -> None:
    """Real pair, prefill scheduler stopped: the decode's request waits for KV with its /health 200. The prefill
    is the cause (its own rules judge it); the decode is not restarted, however long it waits."""
    late = S.stall_after_s * 3
    assert diagnose([stalled(late, pd_queue=1.0, pd_stalled_s=late)], pd_ctx(*prefills), NOW) is None


def test_a_prefill_not_read_for_half_the_window_cannot_vouch_for_itself() -> None:
    """Real pair: a stopped prefill's /ready hung a minute and its lease was read late; a reading that old does
    not clear the prefill, so the decode waiting for its KV is not taken for the culprit."""
    late = S.stall_after_s * 3
    old = obs("progress", at=NOW - S.stall_after_s / 2, idle_at=None, stalled_s=0.0)
    assert diagnose([stalled(late, pd_queue=1.0, pd_stalled_s=late)], pd_ctx(old), NOW) is None
    fresh = obs("progress", at=NOW - 1, idle_at=None, stalled_s=0.0)
    fault = diagnose([stalled(late, pd_queue=1.0, pd_stalled_s=late)], pd_ctx(fresh), NOW)
    assert fault is not None and fault.kind == "pd_transfer_wedge"


def test_a_decode_waiting_for_a_stalled_prefill_is_no_collective_hang() -> None:
    """Real pair, prefill scheduler stopped: the decode's scheduler sits in its loop (caught in any frame, here
    a collective) with every request waiting for KV; strong stack evidence does not make it the culprit."""
    early = S.stall_after_s / 4 + 1
    window = [stalled(early, pd_queue=1.0, pd_stalled_s=early, running=0.0), stacks({"TP0": "broadcast"})]
    blamed = prefill(idle_at=None, stalled_s=early)
    assert diagnose(window, pd_ctx(blamed), NOW) is None
    running = [stalled(early, pd_queue=1.0, pd_stalled_s=early, running=2.0), stacks({"TP0": "broadcast"})]
    fault = diagnose(running, pd_ctx(blamed), NOW)
    assert fault is not None and fault.kind == "collective_hang"


def test_a_decode_polling_its_transfers_is_not_blocked_in_a_collective() -> None:
    """A rank caught in the all-reduce of its KV poll states is in its loop, even after the whole window."""
    late = S.stall_after_s + 1
    window = [stalled(late, pd_queue=1.0, pd_stalled_s=late, running=0.0), stacks({"TP0": "pd_poll"})]
    fault = diagnose(window, pd_ctx(prefill(idle_at=None)), NOW)
    assert fault is not None and fault.kind == "pd_transfer_wedge"


def test_a_decode_whose_requests_all_wait_for_kv_is_no_decode_wedge() -> None:
    """Nothing running, the live transfer queue holding the work: the transfer wedge's rule, not decode_wedge."""
    late = S.stall_after_s + 1
    window = [stalled(late, pd_queue=1.0, pd_stalled_s=late, running=0.0)]
    fault = diagnose(window, pd_ctx(prefill(idle_at=None)), NOW)
    assert fault is not None and fault.kind == "pd_transfer_wedge"


@pytest.mark.parametrize("probe", ["canary_tool", "canary_reasoning", "config_check"])
def test_definitive_canary_failure_is_parser_misconfig(probe: str) -> None:
    """A leak, a structural failure or a wrong /server_info parser is parser_misconfig."""
    fault = diagnose([obs(probe, ok=False, verdict="fail")], ctx("starting", started_at=NOW), NOW)
    assert fault is not None and fault.kind == "parser_misconfig" and fault.evidence["probe"] == probe


def test_inconclusive_canary_is_not_a_fault() -> None:
    """Timeouts and declined calls are retried, never diagnosed as misconfiguration."""
    assert (
        diagnose([obs("canary_tool", ok=False, verdict="inconclusive", soft_fail=True)], ctx(), NOW) is None
    )


def _health_streak(start: float, n: int, status: int | None = 503, step: float = 10.0) -> list[Observation]:
    return [obs("health", ok=False, at=start + i * step, latency=1.0, status=status) for i in range(n)]


def test_persistent_503_without_progress_is_health_unresponsive() -> None:
    """F10 / P5: 503 for unresponsive_after_s with nothing moving."""
    window = [obs("health", at=NOW - 200, status=200), *_health_streak(NOW - 150, 15)]
    window.append(obs("progress", stalled_s=0.0, last_progress_at=NOW - 300))
    fault = diagnose(window, ctx(), NOW)
    assert fault is not None and fault.kind == "health_unresponsive"


def test_503_while_progress_moves_is_not_a_fault() -> None:
    """F13: /health false negatives during a long prefill are not acted on."""
    window = [*_health_streak(NOW - 150, 15), obs("progress", stalled_s=0.0, last_progress_at=NOW - 3)]
    assert diagnose(window, ctx(), NOW) is None


def test_short_503_streak_is_not_a_fault() -> None:
    """A streak shorter than unresponsive_after_s is tolerated."""
    window = [*_health_streak(NOW - 50, 5), obs("progress", stalled_s=0.0, last_progress_at=NOW - 300)]
    assert diagnose(window, ctx(), NOW) is None


def test_503_while_starting_is_not_unresponsive() -> None:
    """503 is normal while warming up."""
    window = _health_streak(NOW - 150, 15)
    assert diagnose(window, ctx("starting", started_at=NOW - 160), NOW) is None


def test_silent_startup_is_startup_stalled() -> None:
    """No progress line for startup_silence_s while starting."""
    window = [
        obs(
            "logs", hits=[], last_progress_at=NOW - S.startup_silence_s - 1, progress_line="Load weight begin"
        )
    ]
    fault = diagnose(window, ctx("starting", started_at=NOW - 400), NOW)
    assert fault is not None and fault.kind == "startup_stalled"
    assert fault.evidence["startup"]["progress_line"] == "Load weight begin"


def test_progress_extends_the_startup_budget() -> None:
    """F15: a slow start that keeps logging JIT progress is not stalled, even past the budget."""
    window = [obs("logs", hits=[], last_progress_at=NOW - 5, progress_line="DeepGEMM JIT Compiling: 90%")]
    assert diagnose(window, ctx("starting", started_at=NOW - S.startup_budget_s - 100), NOW) is None


def test_stream_leak_alerts_without_restart() -> None:
    """F16: a leak only under concurrency is its own kind (the plan alerts, never restarts)."""
    window = [
        obs("canary_tool", verdict="pass"),
        obs("canary_stream", ok=False, verdict="fail", single_ok=True),
    ]
    fault = diagnose(window, ctx(), NOW)
    assert fault is not None and fault.kind == "stream_leak"


def test_wedge_outranks_stream_leak_and_unresponsive() -> None:
    """Precedence: decode_wedge > health_unresponsive > stream_leak."""
    window = [
        obs("canary_stream", ok=False, verdict="fail"),
        *_health_streak(NOW - 150, 15),
        stalled(S.stall_after_s + 5, last_progress_at=NOW - 300),
    ]
    assert kind_of(window, ctx(), NOW) == "decode_wedge"


def test_watchdog_line_is_decode_wedge_and_nccl_timeout_collective() -> None:
    """SGLang's watchdog line names a wedge; a torch NCCL timeout names a collective hang."""
    wd = logs(("decode_wedge", "", "Scheduler watchdog timeout (self.watchdog_timeout=300, self.soft=False)"))
    assert kind_of([wd], ctx(), NOW) == "decode_wedge"
    nccl = logs(("collective_hang", "", "Watchdog caught collective operation timeout: WorkNCCL("))
    assert kind_of([nccl, wd], ctx(), NOW) == "collective_hang"


@pytest.mark.unit
def test_diverging_stacks_decide_a_hang_at_a_quarter_of_the_stall_window() -> None:
    """Strong evidence acts early: ranks in different collectives after 5 s of a 20 s window are a hang."""
    window = [stalled(5.0), stacks({"TP0": "broadcast", "TP1": "all_reduce"}, at=NOW - 1)]
    fault = diagnose(window, ctx(), NOW)
    assert fault is not None and fault.kind == "collective_hang" and fault.onset_at == NOW - 5.0


@pytest.mark.unit
def test_every_rank_in_one_blocking_collective_decides_early() -> None:
    """Every rank in all_reduce with 5 s of no progress is a hang; before that it is nothing."""
    frames = {"TP0": "all_reduce", "TP1": "all_reduce"}
    assert kind_of([stalled(5.0), stacks(frames, at=NOW - 1)], ctx(), NOW) == "collective_hang"
    assert kind_of([stalled(4.0), stacks(frames, at=NOW - 1)], ctx(), NOW) is None


@pytest.mark.unit
def test_ranks_waiting_on_their_own_kernels_wait_the_full_window() -> None:
    """Every rank in synchronize (a slow forward) is weak evidence: nothing at 10 s, a hang at 20 s."""
    frames = {"TP0": "synchronize", "TP1": "synchronize"}
    assert kind_of([stalled(10.0), stacks(frames, at=NOW - 1)], ctx(), NOW) is None
    assert kind_of([stalled(20.0), stacks(frames, at=NOW - 1)], ctx(), NOW) == "collective_hang"


@pytest.mark.unit
def test_frozen_counters_alone_wait_the_full_window() -> None:
    """Work in flight with no progress and no other evidence is a decode wedge only after stall_after_s."""
    assert kind_of([stalled(15.0)], ctx(), NOW) is None
    assert kind_of([stalled(20.0)], ctx(), NOW) == "decode_wedge"


@pytest.mark.unit
def test_gpu_spin_in_every_reading_of_the_early_span_is_a_hang() -> None:
    """GPUs spinning in every reading of the last 5 s, with 5 s of no progress, are a collective hang."""
    readings = [obs("gpu", at=NOW - t, spin=[0, 1], xids=[]) for t in (4.0, 3.0, 2.0, 1.0, 0.0)]
    assert kind_of([stalled(5.0), *readings], ctx(), NOW) == "collective_hang"


@pytest.mark.unit
def test_gpu_spin_in_one_reading_waits_the_full_window() -> None:
    """One spinning reading among busy ones is not strong evidence before stall_after_s."""
    readings = [obs("gpu", at=NOW - t, spin=[] if t else [0], xids=[]) for t in (3.0, 2.0, 1.0, 0.0)]
    assert kind_of([stalled(6.0), *readings], ctx(), NOW) is None
    assert kind_of([stalled(20.0), *readings], ctx(), NOW) == "collective_hang"


def test_a_blocked_pre_allocation_queue_is_the_decodes_own_stand() -> None:
    """Real pair, a prompt too large for the decode's pool: the decode's queue is all pre-allocation, its prefill
    holds the request in its bootstrap queue waiting for the decode — the prefill is not blamed, the decode's stand
    is a `pd_transfer_wedge` tagged `prealloc_blocked` (policies.abort aborts it first)."""
    late = S.stall_after_s + 1
    waiting = obs("progress", idle_at=None, stalled_s=late, pd_queue=1.0, pd_waiting=1.0, running=0.0)
    window = [stalled(late, pd_queue=4.0, pd_waiting=0.0, pd_stalled_s=late, running=0.0)]
    fault = diagnose(window, pd_ctx(waiting), NOW)
    assert fault is not None and fault.kind == "pd_transfer_wedge"
    assert fault.evidence["tags"] == ["prealloc_blocked"] and "pre-allocation queue" in fault.reason
    transfer = [stalled(late, pd_queue=4.0, pd_waiting=4.0, pd_stalled_s=late, running=0.0)]
    fault = diagnose(transfer, pd_ctx(prefill(idle_at=None)), NOW)
    assert fault is not None and fault.evidence["tags"] == []


def test_a_stopped_prefills_stale_bootstrap_queue_does_not_clear_it() -> None:
    """Real pair under load: the stop caught a request in the prefill's bootstrap queue, and its frozen snapshot
    says it waits for the decode — but the decode pre-allocated that request and waits for its KV. The prefill is
    blamed: the decode stands aside (no `pd_transfer_wedge`, found in the real tier: both were restarted)."""
    late = S.stall_after_s + 1
    stale = obs("progress", idle_at=None, stalled_s=late, pd_queue=1.0, pd_waiting=1.0, running=0.0)
    awaiting_kv = [stalled(late, pd_queue=1.0, pd_waiting=1.0, pd_stalled_s=late, running=0.0)]
    assert diagnose(awaiting_kv, pd_ctx(stale), NOW) is None


def test_a_prefill_whose_requests_wait_for_a_decode_is_no_decode_wedge() -> None:
    """The prefill's requests all sit in its bootstrap queue (the decode has not pre-allocated): its stall is the
    decode's, judged on the decode; a prefill with its own work stalled is still a wedge."""
    late = S.stall_after_s * 3
    waiting = [stalled(late, pd_queue=2.0, pd_waiting=2.0, running=0.0)]
    assert diagnose(waiting, ctx(role="prefill"), NOW) is None
    own = [stalled(late, pd_queue=2.0, pd_waiting=1.0, running=0.0)]
    assert kind_of(own, ctx(role="prefill"), NOW) == "decode_wedge"


def test_a_stopped_decodes_last_published_queue_is_no_transfer_wedge() -> None:
    """Real pair, decode scheduler SIGSTOPped: its /v1/loads snapshot stays as last published (a request waiting
    for KV); with its scheduler frozen that is no live queue — the stall is the decode's own (`decode_wedge`, as on
    a unified server), not a transfer wedge nor a wait for KV that nobody judges (found: 120 s to detect)."""
    late = S.stall_after_s + 1
    window = [
        stalled(late, pd_queue=1.0, pd_waiting=1.0, pd_stalled_s=late, running=0.0),
        obs("ranks", main_alive=True, missing=[], zombie=[], frozen=["sglang::scheduler"]),
    ]
    assert kind_of(window, pd_ctx(prefill(idle_at=None)), NOW) == "decode_wedge"
