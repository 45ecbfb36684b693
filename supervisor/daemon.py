"""The daemon: config, state file, one runtime per server, status HTTP, signals, sd_notify."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from pathlib import Path

import structlog

from policies.pd import start_order
from policies.states import ServerState, worst
from supervisor.alerts.from_config import build_dispatcher
from supervisor.config import Config, ConfigError, load_config
from supervisor.host.gpu import open_backend
from supervisor.loop.context import Context
from supervisor.loop.runtime import Command, ServerRuntime
from supervisor.records.journal import IncidentJournal
from supervisor.records.statefile import StateFile
from supervisor.reporting import sdnotify
from supervisor.reporting.metrics import SupervisorMetrics
from supervisor.reporting.status_http import StatusServer

log = structlog.get_logger()


class Daemon:
    """Owns every server of one host's deployment."""

    def __init__(self, config: Config, config_path: Path | None = None) -> None:
        self.config = config
        self.config_path = config_path
        sup = config.supervisor
        Path(sup.state_dir).mkdir(parents=True, exist_ok=True)
        Path(sup.log_dir).mkdir(parents=True, exist_ok=True)
        self.metrics = SupervisorMetrics()
        backend = open_backend(sup.gpu_backend, Path(sup.sim_state_dir) if sup.sim_state_dir else None)
        self.ctx = Context(
            config,
            StateFile.load(Path(sup.state_dir) / "state.json"),
            self.metrics,
            backend,
            IncidentJournal(Path(sup.state_dir) / "incidents.jsonl"),
            build_dispatcher(config.alerts, self.metrics),
            self._state_changed,
        )
        roles = {s.name: s.role for s in config.servers}
        order = start_order(roles, {s.name: list(s.depends_on) for s in config.servers})
        self.runtimes = [ServerRuntime(config.server(name), self.ctx) for name in order]
        self.ctx.runtimes = {rt.name: rt for rt in self.runtimes}
        self.last_tick = time.monotonic()
        self.started = time.time()
        self.stop_event = asyncio.Event()
        self.status = StatusServer(self)

    @property
    def state(self) -> ServerState:
        """The daemon's state: the worst of its servers."""
        return worst(rt.state for rt in self.runtimes)

    def status_line(self) -> str:
        """One line for systemd's STATUS= and the logs."""
        parts = [
            f"{rt.name}={rt.state.value}" + (f"(rung {rt.rung})" if rt.rung else "") for rt in self.runtimes
        ]
        return f"{self.state.value}: " + " ".join(parts)

    def _state_changed(self) -> None:
        sdnotify.status(self.status_line())

    def runtime(self, name: str | None) -> list[ServerRuntime]:
        """The named server, or all of them."""
        if name is None:
            return list(self.runtimes)
        return [rt for rt in self.runtimes if rt.name == name]

    async def control(self, kind: str, server: str | None, reason: str, actor: str) -> dict[str, str]:
        """Queue an operator command for one or all servers; answers once each runtime took it."""
        targets = self.runtime(server)
        if not targets:
            raise KeyError(server or "")
        results: dict[str, str] = {}
        loop = asyncio.get_running_loop()
        for rt in targets:
            done: asyncio.Future[str] = loop.create_future()
            rt.commands.put_nowait(Command(kind, reason, actor, done))
            try:
                results[rt.name] = await asyncio.wait_for(asyncio.shield(done), timeout=5.0)
            except TimeoutError:
                results[rt.name] = "queued"
        return results

    def reload(self) -> None:
        """SIGHUP: re-read the config; keep the old one if the new is invalid; argv changes apply at next launch."""
        if self.config_path is None:
            return
        try:
            new = load_config(self.config_path)
        except ConfigError as exc:
            log.error("config.reload_rejected", errors=exc.format_errors())
            return
        names_old = {s.name for s in self.config.servers}
        names_new = {s.name for s in new.servers}
        if names_old != names_new:
            log.error(
                "config.reload_rejected", reason="servers added or removed: restart the daemon to apply"
            )
            return
        self.config = new
        self.ctx.config = new
        for rt in self.runtimes:
            rt.cfg = new.server(rt.name)
        log.info("config.reloaded", path=str(self.config_path))

    async def tick(self) -> None:
        """The daemon's heartbeat: /healthz freshness, metrics timestamp, systemd watchdog."""
        interval = sdnotify.watchdog_interval_s()
        period = min(self.config.supervisor.tick_s, (interval / 3) if interval else 5.0)
        while not self.stop_event.is_set():
            self.last_tick = time.monotonic()
            self.metrics.tick(time.time())
            sdnotify.watchdog()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop_event.wait(), timeout=period)

    async def run(self) -> int:
        """Run until SIGTERM/SIGINT; then stop every server in order and return 0."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop_event.set)
        loop.add_signal_handler(signal.SIGHUP, self.reload)
        loop.add_signal_handler(signal.SIGQUIT, lambda: log.warning("signal.sigquit_ignored"))
        if self.ctx.alerts is not None:
            await self.ctx.alerts.start()
        await self.status.start()
        ticker = asyncio.create_task(self.tick())
        tasks = [asyncio.create_task(rt.run(), name=f"server.{rt.name}") for rt in self.runtimes]
        sdnotify.ready(self.status_line())
        log.info(
            "daemon.started",
            pid=os.getpid(),
            status_url=self.status.url,
            servers=[rt.name for rt in self.runtimes],
        )
        await self.stop_event.wait()
        log.info("daemon.stopping")
        sdnotify.stopping()
        for rt in reversed(self.runtimes):
            rt.stopping = True
            rt.commands.put_nowait(Command("stop", "daemon stopping", "supervisor"))
        await asyncio.gather(*tasks, return_exceptions=True)
        for task in tasks:
            if task.done() and not task.cancelled() and task.exception() is not None:
                log.error("server.task_failed", task=task.get_name(), error=repr(task.exception()))
        ticker.cancel()
        await self.status.stop()
        if self.ctx.alerts is not None:
            await self.ctx.alerts.aclose(5.0)
        self.ctx.save_state()
        log.info("daemon.stopped")
        return 0
