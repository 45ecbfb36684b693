"""The real causes of every alert of monitoring/alerts.yaml on one `AlertingHost`, injected at the same time, each
followed by the recovery an operator (or the supervisor) makes once its alert fires.

`Causes.start()` runs one thread per cause; each records when its fault began (`started`) and when it was
recovered (`recovered`), as Unix times, for the tests and the figures of benchmarks/README.md. The stop of the
daemon (SglangSupervisorDown, SglangSupervisorAbsent: `stop_daemon`, `start_daemon`) ends the run, once the other
chains are done. A cause's `events` is the series that counts its events, for the alerts over a window of events.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.alerting_host import AlertingHost
from tests.support.http import http
from tests.support.prometheus import Prometheus
from tests.support.receiver import Receiver
from tests.support.wait import wait_for

WEBHOOK = "/webhook"
PAGER, TICKET = "/pager", "/ticket"  # where Alertmanager delivers pages and tickets
CAUSE_TIMEOUT_S = 150.0
FATAL_XID = 79  # "GPU has fallen off the bus"
XID_CRASH_AFTER_S = 3  # the Xid is on record that long before the rank aborts, as the driver reports it first


@dataclass
class Cause:
    """One alert's cause: the labels its firing alert must carry, and when the fault began and was recovered."""

    alert: str
    labels: dict[str, str]
    events: str = ""  # PromQL: the series counting the cause's events (an alert over a window of events)
    started: float | None = None
    recovered: float | None = None
    error: str = ""


@dataclass
class Causes:
    """Every cause on one host; `start()` injects them all, `done()` says whether each chain has ended."""

    host: AlertingHost
    prometheus: Prometheus
    receiver: Receiver
    state_dir: Path
    daemon_started: float
    causes: dict[str, Cause] = field(default_factory=dict)
    threads: list[threading.Thread] = field(default_factory=list)

    def __post_init__(self) -> None:
        instance = f"127.0.0.1:{self.host.http_port}"

        def selector(metric: str, **labels: str) -> str:
            matchers = ", ".join(f'{k}=~"{v}"' for k, v in {"instance": instance, **labels}.items())
            return f"{metric}{{{matchers}}}"

        incidents, restarts = "sglang_supervisor_incidents_total", "sglang_supervisor_restarts_total"
        for alert, labels, events in (
            (
                "SglangWedgeDetected",
                {"server": "wedge", "fault": "collective_hang"},
                selector(incidents, server="wedge", fault="collective_hang"),
            ),
            ("SglangServerCrashLoop", {"server": "crashy"}, selector(restarts, server="crashy")),
            ("SglangServerFailed", {"server": "crashy"}, ""),
            (
                "SglangParserMisconfigured",
                {"server": "parser"},
                selector(incidents, server="parser", fault="parser_misconfig"),
            ),
            ("SglangServerDegraded", {"server": "leaky"}, ""),
            ("SglangCanaryUnproven", {"server": "slowcanary"}, ""),
            ("SglangGpuFault", {"server": "gpu"}, selector(incidents, server="gpu", fault="gpu_fault")),
            ("SglangServerDown", {"server": "slowstart"}, ""),
            (
                "SglangSupervisorStateUnwritable",
                {"file": "journal"},
                selector("sglang_supervisor_state_write_failures_total", file="journal"),
            ),
            (
                "SglangSupervisorAlertDeliveryFailing",
                {"sink": "webhook"},
                selector(
                    "sglang_supervisor_alert_deliveries_total", sink="webhook", outcome="failed|dropped"
                ),
            ),
            ("SglangSupervisorDown", {}, ""),
        ):
            self.causes[alert] = Cause(alert, {"instance": instance, **labels}, events)
        self.causes["SglangSupervisorAbsent"] = Cause("SglangSupervisorAbsent", {})

    def start(self) -> None:
        """Inject every fault now (each as soon as its server serves), in threads of their own."""
        for name in ("SglangParserMisconfigured", "SglangCanaryUnproven", "SglangServerDown"):
            self.causes[name].started = self.daemon_started  # launch-time causes: the daemon's start
        chains: list[tuple[str, Callable[[], None]]] = [
            ("SglangWedgeDetected", self.wedge),
            ("SglangServerFailed", self.crash_loop),
            ("SglangParserMisconfigured", self.parser_fixed),
            ("SglangServerDegraded", self.stream_leak),
            ("SglangCanaryUnproven", self.slow_canary),
            ("SglangGpuFault", self.gpu_fault),
            ("SglangServerDown", self.slow_start),
            ("SglangSupervisorStateUnwritable", self.full_disk),
            ("SglangSupervisorAlertDeliveryFailing", self.refusing_sink),
        ]
        for alert, chain in chains:
            thread = threading.Thread(target=self._run, args=(alert, chain), name=alert, daemon=True)
            thread.start()
            self.threads.append(thread)

    def _run(self, alert: str, chain: Callable[[], None]) -> None:
        try:
            chain()
        except Exception:
            self.causes[alert].error = traceback.format_exc()

    def join(self, timeout: float) -> None:
        """Wait for every chain to end (each is bounded by its own deadlines)."""
        deadline = time.monotonic() + timeout
        for thread in self.threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    def errors(self) -> dict[str, str]:
        """The chains that failed, with their traceback."""
        return {name: c.error for name, c in self.causes.items() if c.error}

    def stop_daemon(self) -> list[str]:
        """Stop the daemon as `systemctl stop` does (the run's last cause); what broke the invariants."""
        problems = self.host.stop_checked()
        self.host.watch = None
        self.causes["SglangSupervisorDown"].started = self.causes["SglangSupervisorAbsent"].started = (
            time.time()
        )
        return problems

    def start_daemon(self) -> None:
        """Start the daemon again on the same config: the recovery of the stop."""
        self.host.start()
        now = time.time()
        self.causes["SglangSupervisorDown"].recovered = self.causes["SglangSupervisorAbsent"].recovered = now

    # -- helpers ---------------------------------------------------------------------------------------------

    def firing(self, alert: str) -> bool:
        """Whether Prometheus has `alert` firing now with its cause's labels."""
        want = self.causes[alert].labels
        return any(
            a["labels"].get("alertname") == alert
            and a["state"] == "firing"
            and all(a["labels"].get(k) == v for k, v in want.items())
            for a in self.prometheus.alerts()
        )

    def wait_firing(self, alert: str) -> None:
        wait_for(lambda: self.firing(alert), CAUSE_TIMEOUT_S, f"{alert} firing", interval=0.25)

    def notified(self, alert: str, labels: dict[str, str]) -> bool:
        """Whether Alertmanager has delivered `alert` firing with `labels` (to the pager or the tickets)."""
        return any(
            a["status"] == "firing"
            and a["labels"].get("alertname") == alert
            and all(a["labels"].get(k) == v for k, v in labels.items())
            for path in (PAGER, TICKET)
            for d in self.receiver.at(path)
            for a in d.body["alerts"]
        )

    def wait_notified(self, alert: str, **labels: str) -> None:
        """Wait until the operator is notified of `alert` (its cause's labels, or those given): the moment an
        operator acts. An alert resolved within Alertmanager's group_wait is never delivered."""
        want = labels or self.causes[alert].labels
        wait_for(
            lambda: self.notified(alert, want), CAUSE_TIMEOUT_S, f"{alert} {want} notified", interval=0.25
        )

    def wait_serving(self, server: str, after: str = "") -> None:
        """Wait for `server` to serve (with `after`: with an incident of that fault kind as its last one)."""

        def serving(servers: dict[str, dict[str, Any]]) -> bool:
            entry = servers[server]
            last = entry.get("last_incident") or {}
            return bool(entry["state"] == "serving" and (not after or last.get("fault") == after))

        self.host.wait_all(
            serving, CAUSE_TIMEOUT_S, f"{server} serving" + (f" after {after}" if after else "")
        )

    def sim_fault(self, server: str, fault: dict[str, Any]) -> float:
        """Arm a fault in a server's simulator now (`POST /sim/fault`); the time it was armed."""
        answer = http(self.host.spec(server).url + "/sim/fault", "POST", fault)
        assert answer.status == 200, (server, answer.status, answer.body[:300])
        return time.time()

    def control(self, action: str, server: str, reason: str) -> None:
        status, body = self.host.post(
            f"/control/{action}", {"server": server, "reason": reason}, token=self.host.token
        )
        assert status == 200, (action, server, status, body)

    # -- the causes ------------------------------------------------------------------------------------------

    def wedge(self) -> None:
        """A TP desync hang (F1): detected as collective_hang, the tree killed and relaunched."""
        self.wait_serving("wedge")
        cause = self.causes["SglangWedgeDetected"]
        cause.started = self.sim_fault("wedge", {"name": "overlap_tp_desync_hang", "after_requests": 1})
        self.wait_firing(cause.alert)
        self.wait_serving("wedge", after="collective_hang")
        cause.recovered = time.time()

    def parser_fixed(self) -> None:
        """Launched without --tool-call-parser: the supervisor notices the family's parser missing, launches with
        it (an incident "fixed before launch"), and the server serves."""
        self.wait_firing("SglangParserMisconfigured")
        self.wait_serving("parser", after="parser_misconfig")
        self.causes["SglangParserMisconfigured"].recovered = time.time()

    def slow_start(self) -> None:
        """A 40 s DeepGEMM JIT at launch: not serving for longer than the (shortened) for:, then serving."""
        self.wait_serving("slowstart")
        self.causes["SglangServerDown"].recovered = time.time()

    def crash_loop(self) -> None:
        """A CUDA OOM at every launch until the restart budget is spent (failed); the operator removes the cause
        and restarts the server."""
        self.wait_serving("crashy")
        scenario = self.host.root / "crashy.toml"
        scenario.write_text('[[fault]]\nname = "runtime_cuda_oom_crash"\nafter_requests = 1\n')
        started = self.sim_fault("crashy", {"name": "runtime_cuda_oom_crash", "after_requests": 1})
        self.causes["SglangServerCrashLoop"].started = self.causes["SglangServerFailed"].started = started
        self.wait_notified("SglangServerFailed")
        self.wait_notified("SglangServerCrashLoop")
        scenario.write_text("")
        self.control("restart", "crashy", "the OOM is fixed")
        self.causes["SglangServerFailed"].recovered = self.causes["SglangServerCrashLoop"].recovered = (
            time.time()
        )

    def stream_leak(self) -> None:
        """Tool markup leaking into streams under load (F16): degraded, never restarted; the operator restarts."""
        self.wait_serving("leaky")
        self.causes["SglangServerDegraded"].started = self.sim_fault(
            "leaky", {"name": "tool_markup_leak_under_load", "concurrency_ge": 2}
        )
        self.wait_notified("SglangServerDegraded")
        self.control("restart", "leaky", "a clean relaunch")
        self.causes["SglangServerDegraded"].recovered = time.time()

    def slow_canary(self) -> None:
        """Canaries that time out on a slow model: serving unproven; the operator raises the canary timeout and
        reloads the daemon (SIGHUP), the next canary passes."""
        self.wait_notified("SglangCanaryUnproven")
        self.host.spec("slowcanary").probes["canary_timeout_s"] = 30
        self.host.write()
        assert self.host.daemon is not None
        os.kill(self.host.daemon.pid, signal.SIGHUP)
        self.causes["SglangCanaryUnproven"].recovered = time.time()

    def gpu_fault(self) -> None:
        """A fatal Xid 79 (F9 with the GPU fallen off the bus): gpu_fault, the server failed, not restarted; the
        operator replaces the card and restarts the server, which serves again."""
        self.wait_serving("gpu")
        cause = self.causes["SglangGpuFault"]
        cause.started = self.sim_fault(
            "gpu",
            {
                "name": "illegal_memory_access",
                "after_requests": 1,
                "params": {"xid": FATAL_XID, "crash_after_s": XID_CRASH_AFTER_S},
            },
        )
        self.wait_notified(cause.alert)
        self.wait_notified("SglangServerFailed", **cause.labels)
        self.control("restart", "gpu", "the card is replaced")
        self.wait_serving("gpu")
        cause.recovered = time.time()

    def full_disk(self) -> None:
        """state_dir's file system full while the other faults are journaled; freed once the operator is told."""
        filler = self.state_dir / "filler"
        self.causes["SglangSupervisorStateUnwritable"].started = fill(filler)
        try:
            self.wait_notified("SglangSupervisorStateUnwritable")
        finally:
            filler.unlink()
        self.causes["SglangSupervisorStateUnwritable"].recovered = time.time()

    def refusing_sink(self) -> None:
        """The webhook refuses every alert (503) until the operator is told, then accepts them."""
        cause = self.causes["SglangSupervisorAlertDeliveryFailing"]
        first = wait_for(lambda: self.receiver.at(WEBHOOK), CAUSE_TIMEOUT_S, "a webhook delivery")
        cause.started = first[0].at
        try:
            self.wait_notified("SglangSupervisorAlertDeliveryFailing")
        finally:
            self.receiver.accept(WEBHOOK)
        cause.recovered = time.time()


def fill(filler: Path) -> float:
    """Write `filler` until its file system refuses (ENOSPC); the time it was full."""
    with open(filler, "wb") as fh, contextlib.suppress(OSError):
        while True:
            fh.write(b"\0" * 65536)
            fh.flush()
    return time.time()
