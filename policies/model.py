"""The data both sides of the loop share: observations, the typed values of each probe, probe settings, the tree.

`probes/` produces these, `policies/` decides on them, `supervisor/` carries them; nothing here does I/O, so
`policies/` imports this module and never `probes` or `supervisor`.

Each probe's `values` is a TypedDict: the probe builds it under that type and the policies read it through the
accessor of that probe, so a renamed key breaks the type check, not production.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypedDict, cast

PROBES = (
    "health",
    "canary_tool",
    "canary_reasoning",
    "canary_stream",
    "config_check",
    "progress",
    "ranks",
    "logs",
    "gpu",
    "stacks",
    "engine",
)
CANARY_PROBES = frozenset({"canary_tool", "canary_reasoning", "canary_stream", "config_check"})


@dataclass(frozen=True)
class Observation:
    """A timestamped fact from one probe; a probe that times out or errors gives ok=False, never raises."""

    probe: str  # one of PROBES
    at: float  # monotonic time the observation completed
    ok: bool
    detail: str  # one line for humans
    latency_s: float | None = None
    values: Mapping[str, Any] = field(default_factory=dict)  # the probe's TypedDict below, JSON-ready


@dataclass(frozen=True)
class Fault:
    """A diagnosed fault: a kind of docs/contracts.md and the evidence that decided it."""

    kind: str
    evidence: Mapping[str, Any]  # names the probes and values that decided it; "tags" feeds the ladders
    confidence: float  # 0..1
    reason: str  # one line
    onset_at: float | None = None  # monotonic: when the fault began, as far as the evidence tells


def make_fault(
    kind: str, reason: str, confidence: float, onset: float | None = None, **evidence: Any
) -> Fault:
    """A Fault whose evidence is the keyword arguments, with its `tags` (for the ladders) cleaned of blanks."""
    tags = [t for t in evidence.pop("tags", ()) if t]
    return Fault(kind, {**evidence, "tags": tags}, confidence, reason, onset)


class HealthValues(TypedDict, total=False):
    """`health`: the status code of `/health` (None when no answer), refused while the port is closed."""

    status: int | None
    refused: bool
    timeout: bool


class ProgressValues(TypedDict, total=False):
    """`progress`: the lease on SGLang's token counters (probes/progress.py)."""

    scrape_ok: bool
    work: bool
    work_reasons: list[str]
    stalled_s: float
    last_progress_at: float | None
    moved: list[str]
    running: float | None
    active_gen: float | None
    canary_outstanding: bool
    pd_queue: float | None
    pd_waiting: float | None  # of pd_queue, waiting for the partner (a decode: KV; a prefill: pre-allocation)
    idle_at: float | None  # the newest scrape with nothing running, queued, in flight or in a PD queue
    pd_stalled_s: float
    pd_aborts: int  # the supervisor's aborts in a row that did not free the PD queue's stand
    counters: dict[str, float]


class StuckCandidate(TypedDict, total=False):
    """One of the oldest requests in flight in a `requests` observation."""

    rid: str
    age_s: float
    max_new_tokens: int | None
    finished_since: int  # requests finished since it came
    aborted_s: float | None  # seconds since the supervisor aborted it (None: not aborted)


class RequestsValues(TypedDict, total=False):
    """`requests`: the requests in flight from SGLang's request log (probes/requests.py)."""

    in_flight: int
    finished: int
    p99_e2e_s: float | None  # of the last finished requests
    p99_per_token_s: float | None  # their e2e latency per completion token
    oldest: list[StuckCandidate]
    aborts: int  # requests the supervisor aborted in this launch


class LoadValues(TypedDict, total=False):
    """`load`: the load trend from the scrapes (probes/load.py)."""

    queue: float  # waiting requests, newest scrape
    running: float
    span_s: float  # the scrapes of the last window (`brownout_after_s`) cover this long
    pinned: bool  # the running count stayed the same over it
    queue_grew: float  # by how many requests over it
    queue_dip: float  # the deepest the queue fell below the highest it had been within it
    tokens_per_s: float | None  # decode throughput over it
    baseline_tokens_per_s: float | None  # the server's own highest recent throughput with requests running


class DpRankValues(TypedDict, total=False):
    """One DP rank in a `dp` observation."""

    lag_s: float  # how much older its /v1/loads snapshot is than the newest of its peers'
    running: float
    waiting: float
    timestamp: float


class DpValues(TypedDict, total=False):
    """`dp`: each DP rank's `/v1/loads` snapshot (probes/loads.py), by rank ("0", "1", …)."""

    ranks: dict[str, DpRankValues]


class EngineValues(TypedDict, total=False):
    """`engine`: what SGLang itself says about a deliberate pause (probes/engine.py).

    `ready`/`ping`: the status codes of SGLang's `GET /ready` and `GET /ping` (None: no answer; `ping` is asked
    only when `ready` is not 200). `calls`: SGLang's own count of successful control calls by endpoint.
    `pause_pending`: a `/pause_generation` answered 200 more recently than a `/continue_generation`.
    `paused`: SGLang reports its engine paused (`/ready` 503 with `/ping` 200, or `/ready` 503 with a pause
    pending); `paused_since`: when this pause was first seen (monotonic). `memory_released`: a
    `/release_memory_occupation` more recent than a `/resume_memory_occupation`.
    """

    ready: int | None
    ping: int | None
    calls: dict[str, float]
    pause_pending: bool
    paused: bool
    paused_since: float | None
    memory_released: bool


class LogHit(TypedDict, total=False):
    """One log-signature match."""

    name: str
    kind: str
    tag: str
    line: str


class LogsValues(TypedDict, total=False):
    """`logs`: signature hits and startup progress lines of the server's output."""

    hits: list[LogHit]
    dropped_hits: int
    lines: int
    prefill_batches: int
    decode_batches: int
    last_line_at: float | None
    last_progress_at: float | None
    progress_line: str | None
    ready: bool


class XidEvent(TypedDict, total=False):
    """A GPU Xid event."""

    index: int
    xid: int
    at: float


class GpuValues(TypedDict, total=False):
    """`gpu`: per-GPU summary, GPUs spinning (high utilisation, idle power), busy, Xid events."""

    gpus: list[dict[str, Any]]
    spin: list[int]
    busy: list[int]  # GPUs computing for real (high utilisation and power)
    xids: list[XidEvent]


class RanksValues(TypedDict, total=False):
    """`ranks`: the process tree — main process, missing and zombie ranks, CPU time and state letter per rank.

    `frozen`: ranks stopped (`T`) or in uninterruptible sleep (`D`) whose CPU time did not advance since the
    previous reading: they cannot answer anything until someone resumes them (a SIGSTOP, a rank stuck in the
    driver).
    """

    main_alive: bool
    missing: list[str]
    zombie: list[str]
    cpu_s: dict[str, float]
    cpu_advancing: dict[str, bool]
    states: dict[str, str]
    frozen: list[str]


class StacksValues(TypedDict, total=False):
    """`stacks`: py-spy frames per rank and the collective they are blocked in."""

    ranks: dict[str, dict[str, Any]]
    diverging: bool
    all_in: str | None
    collectives: list[str]
    error: str


class CanaryValues(TypedDict, total=False):
    """`canary_tool`, `canary_reasoning`, `config_check`, `canary_stream`: a verdict and why."""

    verdict: str  # pass | fail | inconclusive
    reason: str
    leaks: list[str]
    cities: list[str]
    soft_fail: bool
    concurrency: int
    passed: int
    failed: dict[str, str]
    single_ok: bool | None
    fail_rate: float
    rid: str  # the request id of a canary (to find it in the server's log)
    dp_rank: int  # the DP rank the canary was routed to (a data-parallel server's canaries take each in turn)
    actual: dict[str, Any]  # config_check: the server's parser settings
    expected: dict[str, Any]  # config_check: what the config says they must be


def health_values(obs: Observation) -> HealthValues:
    """The values of a `health` observation."""
    return cast(HealthValues, obs.values)


def progress_values(obs: Observation) -> ProgressValues:
    """The values of a `progress` observation."""
    return cast(ProgressValues, obs.values)


def requests_values(obs: Observation) -> RequestsValues:
    """The values of a `requests` observation."""
    return cast(RequestsValues, obs.values)


def load_values(obs: Observation) -> LoadValues:
    """The values of a `load` observation."""
    return cast(LoadValues, obs.values)


def dp_values(obs: Observation) -> DpValues:
    """The values of a `dp` observation."""
    return cast(DpValues, obs.values)


def engine_values(obs: Observation) -> EngineValues:
    """The values of an `engine` observation."""
    return cast(EngineValues, obs.values)


def logs_values(obs: Observation) -> LogsValues:
    """The values of a `logs` observation."""
    return cast(LogsValues, obs.values)


def gpu_values(obs: Observation) -> GpuValues:
    """The values of a `gpu` observation."""
    return cast(GpuValues, obs.values)


def ranks_values(obs: Observation) -> RanksValues:
    """The values of a `ranks` observation."""
    return cast(RanksValues, obs.values)


def stacks_values(obs: Observation) -> StacksValues:
    """The values of a `stacks` observation."""
    return cast(StacksValues, obs.values)


def canary_values(obs: Observation) -> CanaryValues:
    """The values of a canary or config-check observation."""
    return cast(CanaryValues, obs.values)


@dataclass(frozen=True)
class TreeView:
    """The supervised process tree as the probes see it this tick."""

    main_alive: bool = True
    missing_ranks: tuple[str, ...] = ()  # ranks that had appeared and are gone (not those still spawning)
    zombie_ranks: tuple[str, ...] = ()
    rank_cpu_s: Mapping[str, float] = field(default_factory=dict)
    rank_states: Mapping[str, str] = field(
        default_factory=dict
    )  # title → /proc state letter (R, S, D, T, ...)


@dataclass(frozen=True)
class ProbeSettings:
    """How often each probe runs, how long it may take, and when silence becomes a fault.

    The defaults are the documented product defaults (docs/config.md). A period of 0 switches that probe off
    where the reference says so (`stream_canary_period_s`).
    """

    health_period_s: float = 10.0
    health_timeout_s: float = 35.0  # above SGLang's 20 s SGLANG_HEALTH_CHECK_TIMEOUT (P3/P4)
    health_failures: int = 3
    canary_period_s: float = 300.0
    canary_timeout_s: float = 60.0
    canary_max_tokens: int = 256
    stream_canary_concurrency: int = 32
    stream_canary_period_s: float = 1800.0
    stream_canary_first_s: float = 30.0  # the first load canary, this long after the first canary passed
    stall_after_s: float = 20.0
    dp_size: int = 1  # the server's DP ranks: above 1, each rank's snapshot is read and judged on its own
    rank_stall_after_s: float = 6.0  # a DP rank whose loop stood this long while a peer's turned is wedged
    stuck_request_min_s: float = 300.0  # a request in flight no shorter than this can be stuck (request log)
    stuck_request_factor: float = 5.0  # … and this many times its peers' p99 latency and max_tokens' time
    brownout_after_s: float = 120.0  # a queue only growing this long, running pinned, throughput far down …
    brownout_fraction: float = 0.3  # … under this fraction of the server's own recent baseline: a brownout
    metrics_period_s: float = 5.0
    metrics_max_bytes: int = 4 * 1024 * 1024
    stacks_budget_s: float = 10.0
    startup_budget_s: float = 1800.0
    startup_silence_s: float = 300.0
    expected_tool_parser: str | None = None  # None = skip the config check for it
    expected_reasoning_parser: str | None = None  # None = no reasoning canary, no config check for it
    unresponsive_after_s: float = 120.0  # 503/timeouts with no progress this long -> health_unresponsive
    max_pause_s: float = 1800.0  # an engine paused by its client longer than this is a pause_overrun
    canary_mode: str = "require"  # require | advisory | off (docs/config.md, "Canary gating")
    canary_inconclusive_limit: int = 3  # inconclusive canaries with /health 200 before serving unproven
    # the server's `--api-key`, sent as `Authorization: Bearer` (SGLang requires it on all but /health*,
    # /ready*, /metrics); never shown: not in repr, and masked wherever the daemon prints or stores anything
    api_key: str | None = field(default=None, repr=False)

    @property
    def canaries_on(self) -> bool:
        """Whether the tool/reasoning canaries run at all."""
        return self.canary_mode != "off"

    @property
    def stream_canary_on(self) -> bool:
        """Whether the load canary runs (`stream_canary_period_s = 0` is off, and so is `canary_mode = off`)."""
        return self.canaries_on and self.stream_canary_period_s > 0


def routine_reading(obs: Observation) -> bool:
    """A local reading that shows nothing wrong (a monitor keeps it for a shorter time than evidence)."""
    if obs.probe == "ranks":
        return obs.ok
    if obs.probe == "gpu":
        return obs.ok and not gpu_values(obs).get("xids")
    return obs.probe in ("requests", "load") or (obs.probe == "logs" and not logs_values(obs).get("hits"))
