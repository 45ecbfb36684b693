"""The daemon: config, state file, one server loop per server, status HTTP, signals, sd_notify.

systemd's `WATCHDOG=1`, `/healthz` and the `loop_last_tick` metric are fed only while every server loop beats
(or is inside a bounded step such as a release): a wedged server loop stops them, and systemd restarts us.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from pathlib import Path
from typing import Any

import structlog

from policies.pd import start_order
from policies.states import ServerState, worst
from supervisor.alerts.from_config import build_dispatcher, delivery_limits
from supervisor.config import Config, ConfigError, load_config
from supervisor.config.changes import changed_sections, restart_needed
from supervisor.config.prepare import prepare
from supervisor.gateway.wiring import membership as gateway_membership
from supervisor.group.etcd import EtcdClient
from supervisor.group.member import GroupMember
from supervisor.group.report import GroupReporter
from supervisor.handover import HANDOVER_WATCHDOG_S
from supervisor.host.gpu import open_backend
from supervisor.host.reaping import OrphanReaper, become_subreaper
from supervisor.loop.clock import Clock, SystemClock
from supervisor.loop.commands import Command, RungChange
from supervisor.loop.host import Host, RealHost
from supervisor.loop.incidents import IncidentBook
from supervisor.loop.server import ServerLoop
from supervisor.loop.services import Services
from supervisor.loop.status_view import engine_pause_line
from supervisor.packaged import version
from supervisor.records.journal import IncidentJournal
from supervisor.records.statefile import StateFile
from supervisor.redaction import register_config, secret_file_warnings
from supervisor.reporting import sdnotify
from supervisor.reporting.metrics import SupervisorMetrics
from supervisor.reporting.readiness import Readiness, verdict
from supervisor.reporting.status_http import StatusServer
from supervisor.rungs import check_rung

log = structlog.get_logger()
EX_UNAVAILABLE = 69  # sysexits: the status port is taken (systemd retries it; a container's PID 1 does not)
STALE_MIN_S = 10.0  # a server loop that has not beaten for max(this, 10 ticks) is wedged


def _rungs(levels: dict[str, int]) -> str:
    """`(collective_hang 1, oom 2)`: the active ladders and their levels ('' when none)."""
    return f"({', '.join(f'{key} {level}' for key, level in sorted(levels.items()))})" if levels else ""


class Daemon:
    """Owns every server of one host's deployment."""

    def __init__(
        self,
        config: Config,
        config_path: Path | None = None,
        *,
        host: Host | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.config = config
        self.config_path = config_path
        prepared = prepare(config)  # ConfigError naming the field: what check-config refuses, run refuses
        register_config(config)
        for warning in secret_file_warnings(config):
            log.warning("config.secret_file_readable", warning=warning)
        sup = config.supervisor
        Path(sup.state_dir).mkdir(parents=True, exist_ok=True)
        Path(sup.log_dir).mkdir(parents=True, exist_ok=True)
        self.metrics = SupervisorMetrics()
        # The real host's orphans are ours to reap (supervisor.host.reaping); a test's fake host has none.
        self.reaper: OrphanReaper | None = None
        if host is None:
            backend = open_backend(sup.gpu_backend, Path(sup.sim_state_dir) if sup.sim_state_dir else None)
            host = RealHost(backend, gpu_enabled=sup.gpu_backend != "none")
            self.reaper = OrphanReaper()
        self.clock = clock or SystemClock()
        self.journal = IncidentJournal(Path(sup.state_dir) / "incidents.jsonl")
        self.alerts = build_dispatcher(config.alerts, list(prepared.sinks), self.metrics)
        self.group: GroupMember | None = None
        self.group_reporter: GroupReporter | None = None
        if config.group is not None and prepared.etcd is not None:
            self.group = GroupMember(config.group.params(), EtcdClient(prepared.etcd))
            self.group_reporter = GroupReporter(self.group, self.metrics)
        self.svc = Services(
            config=config,
            statefile=StateFile.load(Path(sup.state_dir) / "state.json"),
            metrics=self.metrics,
            incidents=IncidentBook(self.journal, self.metrics, self.alerts),
            host=host,
            clock=self.clock,
            on_state_change=self._state_changed,
            group=self.group,
        )
        roles = {s.name: s.role for s in config.servers}
        order = start_order(roles, {s.name: list(s.depends_on) for s in config.servers})
        self.loops = [ServerLoop(config.server(name), self.svc) for name in order]
        self.svc.loops = {loop.name: loop for loop in self.loops}
        self.metrics.watch_servers(lambda: [loop.gauges() for loop in self.loops])
        self.svc.gateway = gateway_membership(config, lambda: self.loops, self.metrics)
        self.started = self.clock.wall()
        self.version = version()  # the running program's: a wheel installed over it shows after a handover
        self.stop_event = asyncio.Event()
        self.handing_over = False  # SIGUSR2: `run` re-executes the daemon after leaving every run alive
        self._reap_due: asyncio.TimerHandle | None = None
        self.status = StatusServer(self, sup.http)

    @property
    def state(self) -> ServerState:
        """The daemon's state: the worst of its servers."""
        return worst(loop.state for loop in self.loops)

    def status_line(self) -> str:
        """One line for systemd's STATUS= and the logs: each server's state and its active rungs, one per ladder."""
        parts = [f"{loop.name}={loop.state.value}{_rungs(loop.owner.levels)}" for loop in self.loops]
        return f"{self.state.value}: " + " ".join(parts)

    def _state_changed(self) -> None:
        sdnotify.status(self.status_line())
        self.status.changed()
        if self.svc.gateway is not None:
            self.svc.gateway.poke()

    def targets(self, name: str | None) -> list[ServerLoop]:
        """The named server, or all of them."""
        if name is None:
            return list(self.loops)
        return [loop for loop in self.loops if loop.name == name]

    # ---- what the status server reads (reporting.status_http.StatusSource)
    def status_document(self) -> dict[str, Any]:
        """The `/status` document."""
        return {
            "version": self.version,
            "state": self.state.value,
            "status_line": self.status_line(),
            "pid": os.getpid(),
            "started_at": self.started,
            "generated_at": self.clock.wall(),
            "servers": [loop.status() for loop in self.loops],
            "group": self.group.status() if self.group is not None else None,
            "gateway": self.svc.gateway.summary() if self.svc.gateway is not None else None,
            "incidents": [i.to_json() for i in list(self.svc.incidents.recent)[-20:]][::-1],
        }

    def incidents_page(self, offset: int, limit: int) -> list[dict[str, Any]]:
        """A page of the journal, newest first."""
        return [i.to_json() for i in self.journal.page(offset, limit)]

    def metrics_text(self) -> bytes:
        """The Prometheus exposition."""
        return self.metrics.render()

    def token_file(self) -> Path | None:
        """The control token's file."""
        return self.config.supervisor.http.token_file

    def loop_health(self) -> tuple[bool, float]:
        """Every server loop fresh?, and the age of the stalest beat."""
        now = self.clock.monotonic()
        after = max(STALE_MIN_S, 10 * self.config.supervisor.tick_s)
        age = max((now - loop.last_beat for loop in self.loops), default=0.0)
        return not any(loop.stale(now, after) for loop in self.loops), age

    async def control(self, kind: str, server: str | None, reason: str, actor: str) -> dict[str, str]:
        """Queue an operator command for one or all servers; answers once each runtime took it."""
        targets = self.targets(server)
        if not targets:
            raise KeyError(server or "")
        results: dict[str, str] = {}
        aio = asyncio.get_running_loop()
        for loop in targets:
            done: asyncio.Future[str] = aio.create_future()
            loop.commands.put_nowait(Command(kind, reason, actor, done))
            try:
                results[loop.name] = await asyncio.wait_for(asyncio.shield(done), timeout=5.0)
            except TimeoutError:
                results[loop.name] = "queued"
        return results

    def readiness(self, server: str | None) -> list[Readiness]:
        """Each server's readiness (or the named one's: KeyError when unknown), from its owner's state."""
        targets = self.targets(server)
        if not targets:
            raise KeyError(server or "")
        now = self.clock.monotonic()
        after = max(STALE_MIN_S, 10 * self.config.supervisor.tick_s)
        return [
            verdict(
                loop.name,
                loop.owner.state.value,
                loop.owner.reason,
                loop.owner.unproven,
                loop.owner.since,
                now - loop.last_beat if loop.stale(now, after) else None,
                engine_pause_line(loop),
            )
            for loop in targets
        ]

    async def control_rung(self, server: str, change: RungChange, reason: str, actor: str) -> dict[str, Any]:
        """An operator's ladder level for one server, checked here (KeyError: unknown server; RungRefused: why
        not), applied by its loop through the owner for the next launch (or at once, with a planned restart)."""
        loop = next(iter(self.targets(server)), None)
        if loop is None:
            raise KeyError(server)
        group = self.config.group
        check_rung(
            loop.name, loop.cfg.role.value, loop.ladders, change, group is not None and group.server == server
        )
        done: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        loop.commands.put_nowait(Command("rung", reason, actor, done, rung=change))
        try:
            result = await asyncio.wait_for(asyncio.shield(done), timeout=5.0)
        except TimeoutError:
            result = "queued"
        return {"servers": {loop.name: result}, "levels": loop.owner.levels}

    def reload(self) -> None:
        """SIGHUP: apply the new config as a whole, or keep the old one and say why (invalid, or needs a restart).

        Probe settings apply at once, argv at the next launch, `[alerts]` by rebuilding the sinks (nothing queued
        is lost); what the daemon built at start is refused by name (`supervisor.config.changes`).
        """
        if self.config_path is None:
            return
        try:
            new = load_config(self.config_path)
            prepared = prepare(new)
        except ConfigError as exc:
            log.error("config.reload_rejected", errors=exc.format_errors())
            return
        needs_restart = restart_needed(self.config, new)
        if needs_restart:
            log.error(
                "config.reload_rejected",
                restart_needed=needs_restart,
                reason="these changes apply only at a daemon restart; nothing was applied",
            )
            return
        changed = changed_sections(self.config, new)
        register_config(new)
        self.config = new
        self.svc.config = new
        for loop in self.loops:
            loop.reconfigure(new.server(loop.name))
        self.alerts.reconfigure(prepared.sinks, **delivery_limits(new.alerts))
        log.info("config.reloaded", path=str(self.config_path), changed=changed)

    async def tick(self) -> None:
        """The daemon's heartbeat: while every server loop is fresh, the metrics timestamp and systemd's watchdog."""
        interval = sdnotify.watchdog_interval_s()
        period = min(self.config.supervisor.tick_s, (interval / 3) if interval else 5.0)
        while not self.stop_event.is_set():
            fresh, age = self.loop_health()
            if self.group_reporter is not None:
                self.group_reporter.publish()
            self._reap_soon()
            if fresh:
                self.metrics.tick(self.clock.wall())
                sdnotify.watchdog()
            else:
                log.error("daemon.loop_stale", age_s=round(age, 1), hint="a server loop stopped beating")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop_event.wait(), timeout=period)

    def _reap(self) -> None:
        """One reaping pass; another once the grace of the zombies it had to leave has passed."""
        self._reap_due = None
        if self.reaper is not None and self.reaper.reap_pass():
            self._reap_due = asyncio.get_running_loop().call_later(self.reaper.grace_s + 0.05, self._reap)

    def _reap_soon(self) -> None:
        """SIGCHLD, and every tick: a pass now (it notes the new zombies) unless one is already due."""
        if self._reap_due is None:
            self._reap()

    def handover(self) -> None:
        """SIGUSR2: stop supervising but leave every server running, for the daemon that `run` re-executes in
        this same process (a planned upgrade: supervisor.loop.adoption). A multi-node group member is not
        handed over (its group would restart): refused, logged."""
        if self.group is not None:
            log.error(
                "daemon.handover_refused", reason="a multi-node group member: restart the daemon instead"
            )
            return
        self.handing_over = True
        self.stop_event.set()

    async def run(self) -> int:
        """Run until SIGTERM/SIGINT (stop every server in order) or SIGUSR2 (hand every server over); 0
        (`EX_UNAVAILABLE` when the status server cannot bind, before any server starts)."""
        aio = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            aio.add_signal_handler(sig, self.stop_event.set)
        aio.add_signal_handler(signal.SIGHUP, self.reload)
        aio.add_signal_handler(signal.SIGUSR2, self.handover)
        aio.add_signal_handler(signal.SIGQUIT, lambda: log.warning("signal.sigquit_ignored"))
        if self.reaper is not None:  # orphaned ranks re-parent to us, not to PID 1
            become_subreaper()
            aio.add_signal_handler(signal.SIGCHLD, self._reap_soon)
        await self.alerts.start()
        try:
            await self.status.start()
        except OSError as exc:  # the port taken (another daemon, a stale listener): say so, exit, be retried
            log.error("daemon.status_bind_failed", url=self.status.url, error=exc.strerror or str(exc))
            await self.alerts.aclose(1.0)
            return EX_UNAVAILABLE
        ticker = asyncio.create_task(self.tick())
        gateway = asyncio.create_task(self.svc.gateway.run()) if self.svc.gateway is not None else None
        tasks = [asyncio.create_task(loop.run_forever(), name=f"server.{loop.name}") for loop in self.loops]
        sdnotify.ready(self.status_line())
        log.info(
            "daemon.started",
            pid=os.getpid(),
            status_url=self.status.url,
            servers=[loop.name for loop in self.loops],
        )
        await self.stop_event.wait()
        if self.handing_over:
            log.info("daemon.handover", hint="every run is left to the daemon that follows (same PID)")
            sdnotify.notify("RELOADING=1", "STATUS=handing over to a new daemon; the servers keep serving")
            sdnotify.watchdog_for(HANDOVER_WATCHDOG_S)
        else:
            log.info("daemon.stopping")
            sdnotify.stopping()
        for loop in reversed(self.loops):
            loop.stopping, loop.detaching = True, self.handing_over
            loop.commands.put_nowait(Command("stop", "daemon stopping", "supervisor"))
        await asyncio.gather(*tasks, return_exceptions=True)
        for task in tasks:
            if task.done() and not task.cancelled() and task.exception() is not None:
                log.error("server.task_failed", task=task.get_name(), error=repr(task.exception()))
        ticker.cancel()
        if gateway is not None and self.svc.gateway is not None:
            if not self.handing_over:
                await self.svc.gateway.round()  # the stopped servers out, whatever a task was doing
            gateway.cancel()
            await self.svc.gateway.client.aclose()
        await self.status.stop()
        await self.alerts.aclose(5.0)
        self.svc.save_state()
        if self.reaper is not None:
            self.reaper.reap(grace_s=0.0)
        log.info("daemon.stopped")
        return 0
