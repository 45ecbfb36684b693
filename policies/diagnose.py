"""Observations → one Fault (or None): pure, explainable, testable in microseconds.

Order of precedence (the first rule that holds decides; later rules only add nothing):

1. `gpu_fault`  — a fatal Xid (48, 62, 63, 64, 74, 79, 92, 94, 95) or a GPU-fault log line: the card is poisoned.
2. `oom`        — a CUDA / KV out-of-memory line (more specific than the crash that follows it).
3. `crash`      — a rank missing or zombie, the main process gone, a fail-stop line, Xid 13/31/43.
                  While `starting` the same evidence is reported as `startup_failure`.
4. `startup_failure` — an init death, port collision, /dev/shm bus error, graph-capture failure.
4a. `pause_overrun` — SGLang reports its engine paused by its client (an RL weight update) for `max_pause_s`.
                  While it reports a pause at all, rules 5-7 read only log lines and rule 9 stands aside
                  (`LEASE_RULES`, `policies.pause`): a pause stops tokens and fails `/health` on purpose.
5. `collective_hang` — work stalled AND (rank stacks in different collectives — a TP desync, tag `tp_desync` —,
                  all in one collective, one blocked in a collective while a peer is frozen (`policies.frozen`),
                  or GPUs spinning at ≥95 % utilisation on ≤35 % power); or an NCCL/Gloo collective timeout line.
                  Strong evidence decides early, after `STRONG_STALL_FRACTION` of `stall_after_s` (5 s of the
                  default 20 s): ranks in different collectives, every rank in one blocking collective, or GPUs
                  spinning in every GPU reading of that span (at least two). Weak evidence — frozen counters
                  with work in flight, nothing else — waits the full `stall_after_s` (a slow forward is not a hang).
5a. `decode_wedge` of one DP rank (tag `dp_rank_wedged`) — its `/v1/loads` snapshot `rank_stall_after_s` older
                  than a peer's (`policies.dp`): the summed counters hide it, the rank is named.
6. `pd_transfer_wedge` — a decode server whose transfer/prealloc queue is non-zero and not draining with no decode
                  progress for `stall_after_s`; for a quarter of it when every prefill sits idle meanwhile (the KV
                  it waits for is not coming: `policies.pd.prefills_idle`). Tag `prealloc_blocked` when all of
                  it waits to pre-allocate (a request too large for the decode's pool blocks the rest).
7. `decode_wedge` — work in flight (frozen running gauge, generation requests active, our own canary) with no
                  token progress for `stall_after_s`, or SGLang's own watchdog line.
7a. `request_stuck` — one request in flight far past its peers and its `max_tokens` while the server serves the
                  rest (SGLang's request log, `policies.stuck`): its id is aborted, the server kept.
7b. `brownout` — a queue only growing for `brownout_after_s`, running requests pinned, throughput under
                  `brownout_fraction` of the server's own baseline (`policies.brownout`): alert first.
8. `parser_misconfig` — a definitive canary failure (leak signature, structural failure, stream/non-stream
                  disagreement) or `/server_info` naming another parser than expected.
9. `health_unresponsive` — /health 503 or timing out for `unresponsive_after_s` (at least `health_failures` in a
                  row) AND no progress in that span; never while `starting` (503 is normal there).
                  At the first failed /health when a rank stayed frozen through its wait (`policies.frozen`).
10. `startup_stalled` — while `starting`: no progress line for `startup_silence_s`, or the startup budget (extended
                  while progress lines keep coming) is spent.
11. `stream_leak` — markup leaks only under concurrent streaming: alert, degrade, never restart.

Busy-but-progressing is never a fault: a long prefill moves prefill counters or logs `Prefill batch` lines, and a
GPU drawing real power is computing, so /health 503 during it is not acted on (failure-modes.md F13).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from policies.brownout import brownout
from policies.canary_faults import parser_fault, stream_leak_fault
from policies.dp import dp_rank_wedge
from policies.frozen import frozen_unresponsive, waiting_on_frozen
from policies.model import (
    Fault,
    Observation,
    ProbeSettings,
    gpu_values,
    health_values,
    make_fault,
    progress_values,
    ranks_values,
    stacks_values,
)
from policies.pause import pause_overrun, paused_engine
from policies.pd import awaits_kv, prefill_blamed, transfer_wedge, waits_on_pair
from policies.startup import startup_stalled
from policies.stuck import stuck_request
from policies.window import Window

FATAL_XIDS = frozenset({48, 62, 63, 64, 74, 79, 92, 94, 95})
STRONG_STALL_FRACTION = 0.25  # of stall_after_s: a stall this long with strong hang evidence is a hang
# waiting for its own kernels or for requests is not a hang, however long it lasts
NOT_BLOCKING = frozenset({"recv_requests", "synchronize", "paused", "pd_poll"})
IDLE_FRAMES = ("recv_requests", "paused", "pd_poll")  # not a hang even after the full stall window
CRASH_XIDS = frozenset({13, 31, 43})
FROZEN_COVER_S = 2.0  # the ranks probe reads every second: a freeze seen this soon after a /health covers it


@dataclass(frozen=True)
class DiagnoseContext:
    """Where the server stands: the phase, its role, when this launch started, the thresholds."""

    phase: str  # "starting" | "serving" | "degraded"
    role: str  # "unified" | "prefill" | "decode" | "router"
    started_at: float  # monotonic, this launch
    settings: ProbeSettings
    healthy_once: bool = False  # /health answered 200 in this launch: a death now is a crash, not a startup
    prefills: tuple[Observation | None, ...] = ()  # a decode: each prefill's newest progress (None: not up)


def _log_fault(w: Window, kind: str, confidence: float, as_kind: str | None = None) -> Fault | None:
    hits = w.hits(kind)
    if not hits:
        return None
    at, first = hits[0]
    return make_fault(
        as_kind or kind,
        f"log: {first['line'][:160]}",
        confidence,
        onset=at,
        logs=[h for _, h in hits[:5]],
        tags=[h.get("tag", "") for _, h in hits],
    )


def _gpu_fault(w: Window, ctx: DiagnoseContext, now: float) -> Fault | None:
    for obs in reversed(w.all("gpu")):
        fatal = [x for x in gpu_values(obs).get("xids", ()) if int(x.get("xid", 0)) in FATAL_XIDS]
        if fatal:
            return make_fault(
                "gpu_fault",
                f"fatal Xid {fatal[0]['xid']} on GPU {fatal[0].get('index')}",
                0.95,
                onset=obs.at,
                gpu=fatal,
            )
    return _log_fault(w, "gpu_fault", 0.9)


def _oom(w: Window, ctx: DiagnoseContext, now: float) -> Fault | None:
    return _log_fault(w, "oom", 0.9)


def _crash(w: Window, ctx: DiagnoseContext, now: float) -> Fault | None:
    starting = ctx.phase == "starting" and not ctx.healthy_once
    kind = "startup_failure" if starting else "crash"
    ranks = w.latest("ranks")
    if ranks is not None:
        v = ranks_values(ranks)
        if not v.get("main_alive", True):
            return make_fault(kind, "the main process is gone", 0.95, onset=ranks.at, ranks=dict(v))
        missing = list(v.get("missing", ()))  # only ranks that had appeared (the loop's one rule)
        if missing or v.get("zombie"):
            lost = [*missing, *v.get("zombie", ())]
            return make_fault(
                kind,
                f"ranks lost while the main process lives: {', '.join(lost)}",
                0.9,
                onset=ranks.at,
                ranks=dict(v),
            )
    found = _log_fault(w, "crash", 0.85, kind)
    if found is not None:
        return found
    for obs in reversed(w.all("gpu")):
        xids = [x for x in gpu_values(obs).get("xids", ()) if int(x.get("xid", 0)) in CRASH_XIDS]
        if xids:
            return make_fault(
                kind,
                f"Xid {xids[0]['xid']}: the GPU context faulted",
                0.6,
                onset=obs.at,
                gpu=xids,
                tags=["illegal_memory_access"],
            )
    return None


def _startup_failure(w: Window, ctx: DiagnoseContext, now: float) -> Fault | None:
    return _log_fault(w, "startup_failure", 0.9)


def _stalled(w: Window, ctx: DiagnoseContext, fraction: float = 1.0) -> Observation | None:
    progress = w.latest("progress")
    after = ctx.settings.stall_after_s * fraction
    if progress is None or progress_values(progress).get("stalled_s", 0.0) < after:
        return None
    return progress


def _stall_onset(progress: Observation) -> float:
    return progress.at - float(progress_values(progress).get("stalled_s", 0.0))


def _frozen(w: Window) -> bool:
    ranks = w.latest("ranks")
    return ranks is not None and bool(ranks_values(ranks).get("frozen"))


def _spinning(w: Window, since: float | None = None) -> list[int]:
    """GPUs spinning in the latest reading; with `since`, in every reading from then on (at least two)."""
    gpu = w.latest("gpu")
    spin = list(gpu_values(gpu).get("spin", ())) if gpu else []
    if since is None or not spin:
        return spin
    span = [o for o in w.all("gpu") if o.at >= since]
    steady = len(span) >= 2 and all(gpu_values(o).get("spin") for o in span)
    return spin if steady else []


def _collective_hang_logged(w: Window, ctx: DiagnoseContext, now: float) -> Fault | None:
    return _log_fault(w, "collective_hang", 0.9)


def _collective_hang(w: Window, ctx: DiagnoseContext, now: float) -> Fault | None:
    progress = _stalled(w, ctx, STRONG_STALL_FRACTION)
    if progress is None:
        return None
    if (
        ctx.role == "decode"
        and waits_on_pair(ctx.role, progress)
        and prefill_blamed(ctx.prefills, ctx.settings.stall_after_s, now, awaits_kv(progress))
    ):
        return None  # the prefill's own rules judge it (its stopped scheduler parks the decode's requests)
    full = _stalled(w, ctx) is not None
    pv = progress_values(progress)
    stall = {"stalled_s": pv.get("stalled_s"), "work": pv.get("work_reasons")}
    onset = _stall_onset(progress)
    stacks = w.latest("stacks")
    if stacks is not None and stacks.at >= onset:
        sv = stacks_values(stacks)
        frames = sv.get("ranks", {})
        collectives = sorted({str(r["collective"]) for r in frames.values() if r.get("collective")})
        blocked, stopped = waiting_on_frozen(frames, w.latest("ranks"), NOT_BLOCKING)
        if blocked:
            waits = ", ".join(f"{t} in {c}" for t, c in sorted(blocked.items()))
            reason = f"{waits}, waiting on frozen {', '.join(stopped)}"
            return make_fault(
                "collective_hang", reason, 0.9, onset=onset, stacks=frames, progress=stall, frozen=stopped
            )
        if stopped:  # a stopped rank's stack is where it stopped, not where it waits: no stack votes
            sv = {}
        if sv.get("diverging"):
            return make_fault(
                "collective_hang",
                f"ranks blocked in different collectives: {', '.join(collectives)}",
                0.95,
                onset=onset,
                stacks=frames,
                progress=stall,
                tags=["tp_desync"],
            )
        all_in = sv.get("all_in")
        blocking = all_in is not None and all_in not in NOT_BLOCKING
        if blocking or (full and all_in and all_in not in IDLE_FRAMES):
            return make_fault(
                "collective_hang",
                f"every rank blocked in {all_in} with no progress",
                0.85,
                onset=onset,
                stacks=frames,
                progress=stall,
                gpu_spin=_spinning(w),  # supporting evidence when the GPUs spin too
            )
    spin = _spinning(w) if full else _spinning(w, now - ctx.settings.stall_after_s * STRONG_STALL_FRACTION)
    if spin:
        return make_fault(
            "collective_hang",
            f"GPUs {spin} spin (high utilisation, idle power) with no progress",
            0.8,
            onset=onset,
            gpu_spin=spin,
            progress=stall,
        )
    return None


def _dp_rank_wedge(w: Window, ctx: DiagnoseContext, now: float) -> Fault | None:
    return dp_rank_wedge(w, ctx.settings)


def _pd_wedge(w: Window, ctx: DiagnoseContext, now: float) -> Fault | None:
    progress = w.latest("progress")
    if ctx.role != "decode" or progress is None or _frozen(w):
        return None  # a stopped scheduler's last published queues are not live: the stall rules judge it
    logs = [h for _, h in w.hits("pd_transfer_wedge")[:5]]
    return transfer_wedge(
        progress, ctx.prefills, ctx.settings.stall_after_s, STRONG_STALL_FRACTION, now, logs
    )


def _decode_wedge(w: Window, ctx: DiagnoseContext, now: float) -> Fault | None:
    progress = _stalled(w, ctx)
    if progress is not None:
        v = progress_values(progress)
        if waits_on_pair(ctx.role, progress) and not _frozen(w):
            return None  # the transfer wedge's rule judges that (on the decode)
        stacks = w.latest("stacks")
        return make_fault(
            "decode_wedge",
            f"work in flight ({', '.join(v.get('work_reasons', ()))}) and no token progress for "
            f"{float(v.get('stalled_s', 0.0)):.0f}s",
            0.85,
            onset=_stall_onset(progress),
            progress={
                "stalled_s": v.get("stalled_s"),
                "work_reasons": v.get("work_reasons"),
                "running": v.get("running"),
                "active_gen": v.get("active_gen"),
                "counters": v.get("counters"),
            },
            stacks=stacks_values(stacks).get("ranks") if stacks else None,
        )
    return None


def _decode_wedge_logged(w: Window, ctx: DiagnoseContext, now: float) -> Fault | None:
    return _log_fault(w, "decode_wedge", 0.8)


def _unresponsive(w: Window, ctx: DiagnoseContext, now: float) -> Fault | None:
    if ctx.phase == "starting":
        return None
    failing: list[Observation] = []
    for obs in reversed(w.all("health")):
        if obs.ok or health_values(obs).get("refused"):
            break
        failing.append(obs)
    strong = frozen_unresponsive(w, failing)
    if strong is not None:  # strong evidence: the first failed /health decides
        return strong
    s = ctx.settings
    if len(failing) < s.health_failures:
        return None
    since = failing[-1].at - (failing[-1].latency_s or 0.0)
    if now - since < s.unresponsive_after_s:
        return None
    last = w.last_progress_at()
    if last is not None and last >= since:
        return None
    codes = [health_values(o).get("status") for o in reversed(failing)]
    return make_fault(
        "health_unresponsive",
        f"/health failing for {now - since:.0f}s ({len(failing)} probes) with no progress",
        0.8,
        onset=since,
        health={"statuses": codes[-10:], "since": since},
        last_progress_at=last,
    )


def _startup_stalled(w: Window, ctx: DiagnoseContext, now: float) -> Fault | None:
    return startup_stalled(w, ctx.started_at, ctx.settings, now) if ctx.phase == "starting" else None


def _request_stuck(w: Window, ctx: DiagnoseContext, now: float) -> Fault | None:
    return stuck_request(w, ctx.settings)


def _brownout(w: Window, ctx: DiagnoseContext, now: float) -> Fault | None:
    return brownout(w, ctx.settings)


_RULES = (
    _gpu_fault,
    _oom,
    _crash,
    _startup_failure,
    lambda w, ctx, now: pause_overrun(w, ctx.settings, now),
    _collective_hang_logged,
    _collective_hang,
    _dp_rank_wedge,
    _pd_wedge,
    _decode_wedge,
    _decode_wedge_logged,
    _request_stuck,
    _brownout,
    lambda w, ctx, now: parser_fault(w),
    _unresponsive,
    _startup_stalled,
    lambda w, ctx, now: stream_leak_fault(w),
)
# the rules a deliberate engine pause explains: they read the progress lease, the rank stacks and /health
LEASE_RULES = frozenset(
    {_collective_hang, _dp_rank_wedge, _pd_wedge, _decode_wedge, _request_stuck, _brownout, _unresponsive}
)


def diagnose(
    observations: Sequence[Observation],
    ctx: DiagnoseContext,
    now: float,
    only: Collection[str] | None = None,
) -> Fault | None:
    """The fault the observations show, by the precedence in the module docstring, or None.

    With `only`, faults of other kinds are passed over (the phase rules of `policies.triage`), so a kind that
    does not count in this phase never masks one that does.
    """
    window = Window(observations)
    paused = paused_engine(window) is not None
    for rule in _RULES:
        if paused and rule in LEASE_RULES:
            continue
        fault = rule(window, ctx, now)
        if fault is not None and (only is None or fault.kind in only):
            return fault
    return None
