"""The supervisor's own Prometheus metrics (names and labels as in docs/contracts.md).

One `SupervisorMetrics` owns a private `CollectorRegistry`; the daemon calls its methods as events happen
(incidents, probes, deliveries) and the state of each server (state, rung, restarts, canary proof) is read from
its owner at scrape time (`watch_servers`); the status server answers `GET /metrics` with `render()` and
`CONTENT_TYPE`. Label values are checked
against the shared vocabulary so a typo cannot create an unbounded or misspelt series.
"""

from __future__ import annotations

import platform
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from importlib import metadata

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, generate_latest
from prometheus_client.registry import Collector

from policies.group import Phase
from policies.states import FaultKind, ServerState

STATES = tuple(state.value for state in ServerState)
FAULT_KINDS = tuple(kind.value for kind in FaultKind)
PROBE_RESULTS = ("ok", "fail", "timeout", "error")
CANARY_VERDICTS = ("pass", "fail", "inconclusive")
DELIVERY_OUTCOMES = ("ok", "failed", "dropped")
GATEWAY_OPS = ("list", "add", "remove")
GROUP_PHASES = tuple(phase.value for phase in Phase)

CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4

_PREFIX = "sglang_supervisor_"
_DETECTION_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600)
_SERVING_BUCKETS = (1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600, 900, 1800, 3600)
_PROBE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60)
_RELEASE_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120)


def _check(kind: str, value: str, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise ValueError(f"unknown {kind} {value!r}; allowed: {', '.join(allowed)}")
    return value


def _version() -> str:
    try:
        return metadata.version("sglang-supervisor")
    except metadata.PackageNotFoundError:
        return "unknown"


@dataclass(frozen=True)
class ServerGauges:
    """What the metrics read of one server at scrape time (from the owner of its state)."""

    name: str
    state: str
    rung: int
    restarts: Mapping[str, int]  # fault kind -> restarts the supervisor initiated for it
    unproven: bool
    engine_paused: bool = False  # SGLang reports its engine paused by its client (an RL weight update)


class _ServerCollector(Collector):
    """The state metrics of every server, read from their owners when scraped (never pushed, never stale)."""

    def __init__(self, source: Callable[[], Iterable[ServerGauges]]) -> None:
        self.source = source

    def describe(self) -> Iterable[Metric]:
        return list(self._families([]))

    def collect(self) -> Iterable[Metric]:
        return list(self._families(list(self.source())))

    @staticmethod
    def _families(views: list[ServerGauges]) -> Iterable[Metric]:
        state = GaugeMetricFamily(
            _PREFIX + "server_state",
            "Lifecycle state of each supervised server (1 for the current state, 0 for the others).",
            labels=["server", "state"],
        )
        restarts = CounterMetricFamily(
            _PREFIX + "restarts",
            "Server restarts initiated by the supervisor, by the fault that caused them.",
            labels=["server", "fault"],
        )
        rung = GaugeMetricFamily(
            _PREFIX + "fallback_rung",
            "Current fallback-ladder rung of each server (0 = the configured flags).",
            labels=["server"],
        )
        unproven = GaugeMetricFamily(
            _PREFIX + "canary_unproven",
            "1 while a server serves without a passing canary (inconclusive canaries with /health 200).",
            labels=["server"],
        )
        paused = GaugeMetricFamily(
            _PREFIX + "engine_paused",
            "1 while SGLang reports its engine paused by its client (/pause_generation): not a wedge.",
            labels=["server"],
        )
        for v in views:
            current = _check("state", v.state, STATES)
            for name in STATES:
                state.add_metric([v.name, name], 1 if name == current else 0)
            for fault in FAULT_KINDS:
                restarts.add_metric([v.name, fault], v.restarts.get(fault, 0))
            rung.add_metric([v.name], v.rung)
            unproven.add_metric([v.name], 1 if v.unproven else 0)
            paused.add_metric([v.name], 1 if v.engine_paused else 0)
        return (state, restarts, rung, unproven, paused)


class SupervisorMetrics:
    """Every `sglang_supervisor_*` metric, in a registry of its own."""

    def __init__(self, version: str | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        reg = self.registry
        self._incidents = Counter(
            _PREFIX + "incidents",
            "Incidents opened, by server and fault kind.",
            ["server", "fault"],
            registry=reg,
        )
        self._detection = Histogram(
            _PREFIX + "detection_latency_seconds",
            "Time from the first failing observation to the fault being declared.",
            ["fault"],
            buckets=_DETECTION_BUCKETS,
            registry=reg,
        )
        for fault in FAULT_KINDS:
            self._detection.labels(fault=fault)
        self._to_serving = Histogram(
            _PREFIX + "time_to_serving_seconds",
            "Time from fault detection until the server serves again (health 200 and canary pass).",
            ["server"],
            buckets=_SERVING_BUCKETS,
            registry=reg,
        )
        self._probe_duration = Histogram(
            _PREFIX + "probe_duration_seconds",
            "Duration of each probe run.",
            ["server", "probe"],
            buckets=_PROBE_BUCKETS,
            registry=reg,
        )
        self._probe_results = Counter(
            _PREFIX + "probe_results",
            "Probe runs by result (ok, fail, timeout, error).",
            ["server", "probe", "result"],
            registry=reg,
        )
        self._canary = Counter(
            _PREFIX + "canary_results",
            "Canary requests by verdict (pass, fail, inconclusive).",
            ["server", "canary", "verdict"],
            registry=reg,
        )
        self._startup = Histogram(
            _PREFIX + "startup_duration_seconds",
            "Time from a launch until the server serves (health 200 and the canary gate open).",
            ["server"],
            buckets=_SERVING_BUCKETS,
            registry=reg,
        )
        self._write_failures = Counter(
            _PREFIX + "state_write_failures",
            "Writes of state_dir files (journal, state) that failed: full disk, permissions.",
            ["file"],
            registry=reg,
        )
        for what in ("journal", "state"):
            self._write_failures.labels(file=what)
        self._gpu_release = Histogram(
            _PREFIX + "gpu_release_duration_seconds",
            "Time from stopping a server until its GPUs were verified free.",
            ["server"],
            buckets=_RELEASE_BUCKETS,
            registry=reg,
        )
        self._deliveries = Counter(
            _PREFIX + "alert_deliveries",
            "Alert deliveries by sink and outcome (ok, failed, dropped).",
            ["sink", "outcome"],
            registry=reg,
        )
        self._last_tick = Gauge(
            _PREFIX + "loop_last_tick_timestamp_seconds",
            "Unix time of the supervisor loop's last completed tick.",
            registry=reg,
        )
        self._group_generation = Gauge(
            _PREFIX + "group_generation",
            "Current generation of the multi-node group this host belongs to (one bump per group restart).",
            ["group"],
            registry=reg,
        )
        self._group_etcd_up = Gauge(
            _PREFIX + "group_etcd_up",
            "1 while etcd answers this daemon, 0 while it does not (no group restart is possible then).",
            ["group"],
            registry=reg,
        )
        self._group_barrier_wait = Gauge(
            _PREFIX + "group_barrier_wait_seconds",
            "How long this node has waited at the group's release barrier (0 when not waiting).",
            ["group"],
            registry=reg,
        )
        self._group_barrier_timeout = Gauge(
            _PREFIX + "group_barrier_timeout_seconds",
            "The configured barrier timeout: waiting longer alerts.",
            ["group"],
            registry=reg,
        )
        self._group_member_phase = Gauge(
            _PREFIX + "group_member_phase",
            "Phase of each group member as published in etcd (1 for the current phase, 0 for the others).",
            ["group", "node_rank", "phase"],
            registry=reg,
        )
        self._group_bumps = Counter(
            _PREFIX + "group_generation_bumps",
            "Generation bumps this daemon committed (a fault it saw first, or a lost member).",
            ["group"],
            registry=reg,
        )
        self._gateway_calls = Counter(
            _PREFIX + "gateway_calls",
            "Calls to the gateway's /workers API by operation (list add remove) and outcome (ok error).",
            ["op", "outcome"],
            registry=reg,
        )
        self._gateway_member = Gauge(
            _PREFIX + "gateway_member",
            "1 while the gateway lists this server as a worker.",
            ["server"],
            registry=reg,
        )
        self._gateway_out_of_sync = Gauge(
            _PREFIX + "gateway_out_of_sync_seconds",
            "How long this server's gateway membership has differed from what it should be (0 when in sync).",
            ["server"],
            registry=reg,
        )
        build = Gauge(
            _PREFIX + "build_info",
            "Supervisor build metadata (constant 1).",
            ["version", "python"],
            registry=reg,
        )
        build.labels(version=version or _version(), python=platform.python_version()).set(1)
        Gauge(
            _PREFIX + "start_time_seconds",
            "Unix time this supervisor process started: its counters count from then.",
            registry=reg,
        ).set(time.time())
        self._servers: set[str] = set()

    def gateway_call(self, op: str, outcome: str) -> None:
        """One call to the gateway's `/workers` API."""
        self._gateway_calls.labels(op=_check("op", op, GATEWAY_OPS), outcome=outcome).inc()

    def declare_gateway(self, servers: Iterable[str]) -> None:
        """Every gateway series at 0 from the start (the membership alert's and the dashboard's series)."""
        for op in GATEWAY_OPS:
            for outcome in ("ok", "error"):
                self._gateway_calls.labels(op=op, outcome=outcome)
        for server in servers:
            self.gateway_state(server, False, 0.0)

    def gateway_state(self, server: str, member: bool, out_of_sync_s: float) -> None:
        """Whether the gateway lists `server`, and for how long that has differed from what it should."""
        self._gateway_member.labels(server=server).set(1 if member else 0)
        self._gateway_out_of_sync.labels(server=server).set(round(out_of_sync_s, 1))

    def _declare_server(self, server: str) -> None:
        """Create every incident series and every duration histogram of a new server at 0 so rates, alerts and
        the dashboard's increase() see the first event."""
        if server in self._servers:
            return
        self._servers.add(server)
        for fault in FAULT_KINDS:
            self._incidents.labels(server=server, fault=fault)
        for histogram in (self._to_serving, self._startup, self._gpu_release):
            histogram.labels(server=server)

    def watch_servers(self, source: Callable[[], Iterable[ServerGauges]]) -> None:
        """Read each server's state, rung, restarts and proof from `source` at every scrape (its owner's view)."""
        self.registry.register(_ServerCollector(source))
        for view in source():
            self._declare_server(view.name)

    def declare_sink(self, sink: str) -> None:
        """Create the delivery counters of an alert sink at 0."""
        for outcome in DELIVERY_OUTCOMES:
            self._deliveries.labels(sink=sink, outcome=outcome)

    def incident(self, server: str, fault: str) -> None:
        """Count an incident opened on `server`."""
        self._declare_server(server)
        self._incidents.labels(server=server, fault=_check("fault", fault, FAULT_KINDS)).inc()

    def observe_detection(self, fault: str, seconds: float) -> None:
        """Record how long detecting `fault` took."""
        self._detection.labels(fault=_check("fault", fault, FAULT_KINDS)).observe(seconds)

    def observe_time_to_serving(self, server: str, seconds: float) -> None:
        """Record how long `server` took to serve again after an incident."""
        self._to_serving.labels(server=server).observe(seconds)

    def observe_startup(self, server: str, seconds: float) -> None:
        """Record how long one launch of `server` took to serve."""
        self._startup.labels(server=server).observe(seconds)

    def write_failure(self, what: str) -> None:
        """Count a failed write of a state_dir file (`journal` or `state`)."""
        self._write_failures.labels(file=_check("file", what, ("journal", "state"))).inc()

    def probe(self, server: str, probe: str, result: str, duration_s: float) -> None:
        """Record one probe run: its result and duration."""
        self._probe_results.labels(
            server=server, probe=probe, result=_check("probe result", result, PROBE_RESULTS)
        ).inc()
        self._probe_duration.labels(server=server, probe=probe).observe(duration_s)

    def canary(self, server: str, canary: str, verdict: str) -> None:
        """Count one canary verdict."""
        self._canary.labels(
            server=server, canary=canary, verdict=_check("canary verdict", verdict, CANARY_VERDICTS)
        ).inc()

    def observe_gpu_release(self, server: str, seconds: float) -> None:
        """Record how long releasing and verifying the GPUs of `server` took."""
        self._gpu_release.labels(server=server).observe(seconds)

    def alert_delivery(self, sink: str, outcome: str) -> None:
        """Count one alert delivery outcome of `sink`."""
        self.declare_sink(sink)
        self._deliveries.labels(sink=sink, outcome=_check("outcome", outcome, DELIVERY_OUTCOMES)).inc()

    def set_group(
        self, group: str, generation: int, etcd_up: bool, barrier_wait_s: float, barrier_timeout_s: float
    ) -> None:
        """Publish the group's generation, etcd reachability and this node's barrier wait."""
        self._group_bumps.labels(group=group)
        self._group_generation.labels(group=group).set(generation)
        self._group_etcd_up.labels(group=group).set(1 if etcd_up else 0)
        self._group_barrier_wait.labels(group=group).set(barrier_wait_s)
        self._group_barrier_timeout.labels(group=group).set(barrier_timeout_s)

    def set_group_member(self, group: str, node_rank: int, phase: str) -> None:
        """Make `phase` the one current phase of member `node_rank` (\"absent\" clears them all)."""
        for name in GROUP_PHASES:
            self._group_member_phase.labels(group=group, node_rank=str(node_rank), phase=name).set(
                1 if name == phase else 0
            )

    def group_bump(self, group: str) -> None:
        """Count a generation bump this daemon committed."""
        self._group_bumps.labels(group=group).inc()

    def tick(self, now_wall: float) -> None:
        """Mark the supervisor loop alive at Unix time `now_wall`."""
        self._last_tick.set(now_wall)

    def render(self) -> bytes:
        """The text exposition (format 0.0.4) of every metric."""
        return generate_latest(self.registry)
