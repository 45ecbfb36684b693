"""The one pure triage step of the server loop: what this tick shows, and what to do about it.

`triage(window, tree, facts, now)` takes the probes' window, what the process tree showed this tick and where
the server stands (phase, role, this launch), and returns at most one fault, or that startup is proven, or
what startup still waits for. `plan(fault, facts, now)` turns a fault into the recovery plan with its reason.
Phase and role rules live here, once:

- **Tree losses** (main process gone, a rank that had appeared gone or a zombie) are a `crash` — or a
  `startup_failure` while starting if `/health` never answered 200 in this launch. The dying tree's last log
  lines name a more specific kind first (`gpu_fault`, `oom`), and a collective hang or GPU fault the probes saw
  before the death wins over the death it caused.
- **The router** is judged on its own liveness only (`health_unresponsive`, and `startup_stalled` when its
  `/health` has not answered within `startup_budget_s`): wedges behind it belong to the decode or prefill. Its
  canary goes through it, so it is proven only once a prefill and a decode behind it serve: until the config's
  prefills and decodes are up it serves unproven without a warning, as a PD worker waits for its partner.
- **A pair up, its canary inconclusive**: a server that served unproven while its pair was not up warns once
  `canary_inconclusive_limit` canaries through the pair stayed inconclusive (a router that sends the decodes to a
  bootstrap port no prefill listens on: the decode's own 500 is the reason).
- **Starting**: only `parser_misconfig`, `startup_stalled` and the wedges (`STARTUP_WEDGES`) count; 503 and a
  closed port are normal. Startup ends (`serving`) when `/health` is 200 and the canary gate opens:
  `canary_mode = "require"` needs the tool canary (and the reasoning canary when a reasoning parser is expected)
  to pass — or `canary_inconclusive_limit` inconclusive canaries while `/health` is 200, which serves
  *unproven* with a warning instead of stranding a healthy server in `starting`; `"advisory"` and `"off"`
  serve on `/health` 200 alone.
- **Serving / degraded**: any diagnosed fault. A degraded server serves again when what degraded it has
  cleared: its canary passes again, or SGLang no longer reports its engine paused (`pause_overrun`).

Whether a fault restarts is not decided here: `plan` chooses relaunch, alert only or fail, and
`policies.decide.next_step` turns the plan into the loop's next step.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from policies import argv as argv_reader
from policies.abort import abort_first
from policies.backoff import RestartParams, decide_restart, is_stable
from policies.brownout import in_brownout
from policies.diagnose import DiagnoseContext, diagnose
from policies.ladders import Ladder, PastIncident, ladder_key
from policies.model import (
    Fault,
    Observation,
    ProbeSettings,
    canary_values,
    engine_values,
    health_values,
    progress_values,
)
from policies.plan import PARSER_KEY, Plan, plan_recovery
from policies.signatures import scan
from policies.states import FaultKind

# a server that answers /health but wedges on its first canary is not merely slow to start
STARTUP_WEDGES = frozenset(
    {
        FaultKind.DECODE_WEDGE,
        FaultKind.COLLECTIVE_HANG,
        FaultKind.PD_TRANSFER_WEDGE,
        FaultKind.GPU_FAULT,
    }
)
STARTING_FAULTS = STARTUP_WEDGES | {FaultKind.PARSER_MISCONFIG, FaultKind.STARTUP_STALLED}
_TREE_OVERRIDES = frozenset({FaultKind.GPU_FAULT, FaultKind.COLLECTIVE_HANG})
AWAITING = "serving unproven: awaiting"  # how the warning of a server whose pair is not up yet begins


@dataclass(frozen=True)
class TreeFacts:
    """What the process tree showed this tick: the losses that count, the exit code, the last log lines."""

    losses: tuple[str, ...] = ()  # e.g. "rank_lost sglang::scheduler_TP1", "main_exit 1234"
    exit_code: int | None = None
    log_tail: tuple[str, ...] = ()


@dataclass(frozen=True)
class ServerFacts:
    """Where the server stands this tick."""

    role: str  # unified | prefill | decode | router
    phase: str  # starting | serving | degraded
    started_at: float  # monotonic, this launch
    settings: ProbeSettings
    prefills: tuple[
        Observation | None, ...
    ] = ()  # a decode: each prefill's newest progress (None: not serving)
    awaiting: str = ""  # a PD worker or router whose pair is not up: what its canary waits for ("a decode")
    unproven: str = ""  # why it serves unproven now ('' when proven, or not serving)


@dataclass(frozen=True)
class Triage:
    """The outcome of one tick: a fault, startup proven, or nothing (with what startup waits for)."""

    fault: Fault | None = None
    serving: bool = False  # startup proven now: starting → serving
    unproven: str = ""  # serving although the canary never passed (or no longer awaits its pair): the warning
    waiting_for: str = ""  # while starting: what the gate still waits for
    proven: bool = False  # the newest tool canary passed (clears a serving-unproven warning)
    # alert-only fault kinds whose newest canary now passes (a degraded server serves again)
    cleared: frozenset[str] = frozenset()
    awaiting_partner: bool = False  # `unproven` only because no PD partner is up yet: not an alert


def _healthy_once(window: Sequence[Observation]) -> bool:
    return any(o.probe == "health" and o.ok for o in window)


def _latest(window: Sequence[Observation], probe: str) -> Observation | None:
    found = [o for o in window if o.probe == probe]
    return max(found, key=lambda o: o.at) if found else None


def _tree_fault(
    window: Sequence[Observation], tree: TreeFacts, facts: ServerFacts, ctx: DiagnoseContext, now: float
) -> Fault:
    evidence: dict[str, object] = {
        "probe": "ranks",
        "events": list(tree.losses),
        "exit_code": tree.exit_code,
        "log_tail": list(tree.log_tail[-20:]),
    }
    fatal = [h for h in scan(tree.log_tail) if h.signature.fatal]
    tags = sorted({h.signature.tag for h in fatal if h.signature.tag})
    for kind in (FaultKind.GPU_FAULT, FaultKind.OOM):
        lines = [h.line for h in fatal if h.signature.kind == kind][-3:]
        if lines:
            why = f"{kind.value} in the log: {lines[-1][:200]}"
            return Fault(kind.value, {**evidence, "log_hits": lines, "tags": tags}, 0.9, why, now)
    diagnosed = diagnose(window, ctx, now, only=_TREE_OVERRIDES)
    if diagnosed is not None:
        return Fault(
            diagnosed.kind,
            {**evidence, **dict(diagnosed.evidence)},
            diagnosed.confidence,
            diagnosed.reason,
            diagnosed.onset_at,
        )
    starting = facts.phase == "starting" and not ctx.healthy_once
    kind = FaultKind.STARTUP_FAILURE if starting else FaultKind.CRASH
    what = "; ".join(tree.losses)
    return Fault(kind.value, {**evidence, "tags": tags}, 0.95, f"{what} (exit code {tree.exit_code})", now)


def _canary_gate(window: Sequence[Observation], facts: ServerFacts) -> Triage:
    """While starting with /health 200: is the canary gate open?"""
    s = facts.settings
    if s.canary_mode != "require":
        return Triage(serving=True)
    wanted = ["canary_tool"] + (["canary_reasoning"] if s.expected_reasoning_parser else [])
    verdicts = {p: _latest(window, p) for p in wanted}
    config = _latest(window, "config_check")
    config_ok = config is None or canary_values(config).get("verdict") != "fail"
    if config_ok and all(
        o is not None and canary_values(o).get("verdict") == "pass" for o in verdicts.values()
    ):
        return Triage(serving=True)
    if facts.awaiting:  # the canary needs the pair: it serves, unproven, until the pair is up
        proves = "behind it" if facts.role == "router" else "to prove the pair"
        why = f"{AWAITING} {facts.awaiting} with /health 200 {proves}"
        return Triage(serving=True, unproven=why, awaiting_partner=True)
    inconclusive, why = _inconclusive(window, facts, wanted)
    if why:
        return Triage(serving=True, unproven=why)
    if not any(verdicts.values()):
        return Triage(waiting_for="the first canary (/health is 200)")
    return Triage(
        waiting_for=f"a passing canary ({inconclusive} of {s.canary_inconclusive_limit} inconclusive so far)"
    )


def _inconclusive(
    window: Sequence[Observation], facts: ServerFacts, wanted: Sequence[str]
) -> tuple[int, str]:
    """The inconclusive canaries of this launch, and the warning once they reach the limit ('' before)."""
    found = [
        o
        for o in window
        if o.probe in wanted
        and o.at >= facts.started_at
        and canary_values(o).get("verdict") == "inconclusive"
    ]
    if len(found) < facts.settings.canary_inconclusive_limit:
        return len(found), ""
    last = max(found, key=lambda o: o.at)
    why = (
        f"serving unproven: {len(found)} inconclusive canaries with /health 200 "
        f"(last: {canary_values(last).get('reason') or last.detail})"
    )
    return len(found), why


def _still_unproven(window: Sequence[Observation], facts: ServerFacts, proven: bool) -> str:
    """A server that served unproven while its pair was not up, whose pair is up now: still a wait (no warning)
    until its canaries through the pair reach the inconclusive limit, then the warning ('' when proven or still
    waiting for the pair)."""
    if proven or facts.awaiting or not facts.unproven.startswith(AWAITING):
        return ""
    count, why = _inconclusive(window, facts, ("canary_tool",))
    limit = facts.settings.canary_inconclusive_limit
    return why or f"{AWAITING} a passing canary through its pair, up now ({count} of {limit} inconclusive)"


def _waiting_for_health(window: Sequence[Observation]) -> str:
    health = _latest(window, "health")
    if health is None:
        return "/health (no answer yet)"
    v = health_values(health)
    if v.get("refused"):
        return "/health (port closed: loading)"
    return f"/health 200 (last: {v.get('status') or health.detail})"


def _router_startup_spent(window: Sequence[Observation], facts: ServerFacts, now: float) -> Fault | None:
    """A router whose /health has not answered 200 within its startup budget is stalled. The budget alone
    judges it: a router logs no startup progress, and it may wait for its workers' long loads in silence."""
    budget = facts.settings.startup_budget_s
    if now - facts.started_at < budget:
        return None
    evidence = {"startup": {"silent_s": round(now - facts.started_at, 1), "progress_line": None}}
    why = f"startup budget of {budget:.0f}s spent: {_waiting_for_health(window)}"
    return Fault(FaultKind.STARTUP_STALLED.value, evidence, 0.8, why, facts.started_at + budget)


def triage(window: Sequence[Observation], tree: TreeFacts, facts: ServerFacts, now: float) -> Triage:
    """What this tick shows for one server (the rules are in the module docstring)."""
    phase = facts.phase if facts.phase in ("starting", "serving", "degraded") else "serving"
    ctx = DiagnoseContext(
        phase, facts.role, facts.started_at, facts.settings, _healthy_once(window), facts.prefills
    )
    if tree.losses:
        return Triage(fault=_tree_fault(window, tree, facts, ctx, now))
    tool = _latest(window, "canary_tool")
    proven = tool is not None and canary_values(tool).get("verdict") == "pass"
    if facts.role == "router":
        if phase == "starting":
            health = _latest(window, "health")
            if health is not None and health.ok:
                return _canary_gate(window, facts)
            late = _router_startup_spent(window, facts, now)
            return Triage(fault=late) if late else Triage(waiting_for=_waiting_for_health(window))
        fault = diagnose(window, ctx, now, only={FaultKind.HEALTH_UNRESPONSIVE})
        return Triage(fault=fault, proven=proven, unproven=_still_unproven(window, facts, proven))
    if phase == "starting":
        # before the first /health 200 the warmup's first forward (compiling) may outlast the stall window:
        # only startup_stalled judges that phase, besides a parser failure and a fatal GPU error
        counted = (
            STARTING_FAULTS if ctx.healthy_once else STARTING_FAULTS - STARTUP_WEDGES | {FaultKind.GPU_FAULT}
        )
        fault = diagnose(window, ctx, now, only=counted)
        if fault is not None:
            return Triage(fault=fault)
        health = _latest(window, "health")
        if health is None or not health.ok:
            return Triage(waiting_for=_waiting_for_health(window))
        return _canary_gate(window, facts)
    fault = diagnose(window, ctx, now)
    stream = _latest(window, "canary_stream")
    cleared = {FaultKind.PARSER_MISCONFIG.value} if proven else set()
    if stream is not None and canary_values(stream).get("verdict") == "pass":
        cleared.add(FaultKind.STREAM_LEAK.value)
    engine = _latest(window, "engine")
    if engine is not None and not engine_values(engine).get("paused"):
        cleared.add(FaultKind.PAUSE_OVERRUN.value)
    load = _latest(window, "load")
    if load is not None and not in_brownout(load, facts.settings):
        cleared.add(FaultKind.BROWNOUT.value)
    unproven = _still_unproven(window, facts, proven)
    return Triage(fault=fault, proven=proven, unproven=unproven, cleared=frozenset(cleared))


def quiet(window: Sequence[Observation]) -> bool:
    """No work in flight by the newest progress observation (none seen counts as busy)."""
    progress = _latest(window, "progress")
    return progress is not None and not progress_values(progress).get("work", True)


@dataclass(frozen=True)
class PlanFacts:
    """What a recovery plan depends on beyond the fault itself."""

    role: str
    args: tuple[str, ...]  # SGLang's args of the current launch (the command excluded)
    restarts: tuple[float, ...]  # monotonic times of the restarts of the current streak
    serving_since: float | None
    restart: RestartParams
    jitter: float  # a uniform draw in [0, 1)
    history: tuple[PastIncident, ...]
    levels: Mapping[str, int]
    ladders: Mapping[str, Ladder]
    parser_policy: str
    canary_mode: str = "require"
    brownout_policy: str = "alert"


@dataclass(frozen=True)
class Recovery:
    """The plan for a fault, and whether the restart streak was over before it (stable serving)."""

    plan: Plan
    streak_over: bool


def tags(fault: Fault, args: Sequence[str]) -> list[str]:
    """Tags that pick a ladder variant: the causes the evidence names, else what the argv suggests.

    A cause in the evidence (`tp_desync`: ranks in different collectives; `illegal_memory_access`) decides
    the cure; `spec_decode` (the argv runs speculative decoding) picks a variant only when the evidence names
    no cause — a TP desync on a speculative-decoding server keeps it and gets the desync's cure.
    """
    found = [str(t) for t in fault.evidence.get("tags", ()) if isinstance(t, str)]
    if "illegal_memory_access" not in found and "illegal memory access" in str(fault.evidence).lower():
        found.append("illegal_memory_access")
    if not found and argv_reader.value(args, "--speculative-algorithm"):
        found.append("spec_decode")
    return found


def spawn_failure(reason: str, command: Sequence[str], now: float) -> Fault:
    """The launch command could not start at all (missing, not executable): a startup failure no relaunch cures."""
    evidence = {"spawn": reason, "command": list(command[:1])}
    return Fault(
        FaultKind.STARTUP_FAILURE.value, evidence, 1.0, f"the launch command cannot run: {reason}", now
    )


def plan(fault: Fault, facts: PlanFacts, now: float) -> Recovery:
    """What to do about `fault`: relaunch (rung, delay), alert only, or fail — with the reason."""
    if "spawn" in fault.evidence:  # the command cannot run: an operator must fix the host or the config
        return Recovery(
            Plan("fail", f"{fault.evidence['spawn']}; operator needed", levels=facts.levels), False
        )
    kind = FaultKind(fault.kind)
    if (aborting := abort_first(fault, facts.levels)) is not None:
        return Recovery(aborting, False)
    streak_over = is_stable(facts.serving_since, now, facts.restart)
    restarts = () if streak_over else facts.restarts
    restart = decide_restart(restarts, now, facts.restart, facts.jitter)
    key: str | None
    if facts.role == "router":
        key = None  # SGLang's fallback flags do not apply to the router
    elif kind is FaultKind.PARSER_MISCONFIG:
        key = PARSER_KEY
    else:
        key = ladder_key(kind, tags(fault, facts.args), facts.ladders)
    if facts.canary_mode == "advisory" and kind is FaultKind.PARSER_MISCONFIG:
        alert = Plan("alert", "alert only: canary_mode is advisory", levels=facts.levels, page=False)
        return Recovery(alert, streak_over)
    chosen = plan_recovery(
        kind.value,
        key,
        facts.history,
        facts.levels,
        facts.ladders,
        restart,
        facts.parser_policy,
        facts.brownout_policy,
    )
    return Recovery(chosen, streak_over)


@dataclass(frozen=True)
class Promotion:
    """Promote-back: the ladder to step one rung back up, the levels to relaunch with, and why."""

    key: str
    reason: str
    levels: Mapping[str, int]  # every ladder's level after the step (the promoted one lowered by one)

    @property
    def step(self) -> tuple[str, int]:
        """The (ladder, rung) entry the history records, so a returning fault steps back up at once."""
        return self.key, self.levels.get(self.key, 0)


def promotion(
    levels: Mapping[str, int],
    serving_since: float | None,
    now: float,
    *,
    quiet: bool,
    enabled: bool,
    after_s: float,
) -> Promotion | None:
    """After `after_s` of stable serving on a fallback rung, at a quiet moment, try one rung lower (opt-in)."""
    if not enabled or not quiet or serving_since is None or not levels or max(levels.values()) == 0:
        return None
    if now - serving_since < after_s:
        return None
    key = max(levels, key=lambda k: levels[k])
    lowered = {k: (v - 1 if k == key else v) for k, v in levels.items()}
    return Promotion(key, f"stable for {after_s:g}s: try {key} rung {levels[key] - 1}", lowered)
