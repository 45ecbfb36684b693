"""The effectful recovery steps of DESIGN §6, each timed: stop → reap → release GPUs → verify free → sweep.

Blocking work runs in threads so the daemon's loop keeps ticking (and systemd's watchdog keeps being fed).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from supervisor.config import ServerConfig, SupervisorConfig
from supervisor.host import cleanup, gpu, preflight, reaper
from supervisor.host.proctree import ProcId


@dataclass
class ReleaseReport:
    """What one stop-and-release did, for the incident and the logs."""

    ok: bool
    reason: str
    steps: dict[str, float] = field(default_factory=dict)  # step -> seconds
    killed: list[dict[str, Any]] = field(default_factory=list)
    foreign: list[str] = field(default_factory=list)
    swept: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """JSON-ready view."""
        return {
            "ok": self.ok,
            "reason": self.reason,
            "steps_s": {k: round(v, 3) for k, v in self.steps.items()},
            "killed": self.killed,
            "foreign_holders": self.foreign,
            "shm_swept": self.swept,
        }


def wait_ports_free(cfg: ServerConfig, deadline_s: float) -> cleanup.PortsResult:
    """Poll, within one deadline, until every port the server owns can be bound where it binds it."""
    start = time.monotonic()
    result = cleanup.PortsResult(True, "ports free", (), 0.0)
    for host, ports in preflight.port_addresses(cfg).items():
        result = cleanup.wait_ports_free(host, ports, max(0.0, deadline_s - (time.monotonic() - start)))
        if not result.ok:
            break
    return result


async def stop_and_release(
    cfg: ServerConfig,
    sup: SupervisorConfig,
    backend: gpu.GpuBackend,
    *,
    main_pid: int | None,
    pgid: int | None,
    run_id: str,
    mode: str,
    known: list[ProcId],
    any_run_of: str | None = None,
) -> ReleaseReport:
    """Stop the tree (drain or kill), reap every process of ours, verify GPUs and ports free, sweep shm.

    `any_run_of`: a server marker; every run carrying it is reaped too (what a previous daemon left).
    """
    report = ReleaseReport(True, "")
    t0 = time.monotonic()
    result = await asyncio.to_thread(
        reaper.stop,
        main_pid,
        pgid,
        run_id,
        mode,
        cfg.drain_grace_s,
        sup.release_deadline_s,
        sup.allowlist,
        list(cfg.device_paths),
        known,
        any_run_of,
    )
    report.steps["stop_and_reap"] = time.monotonic() - t0
    report.killed = [{"pid": k.pid, "name": k.name, "route": k.route} for k in result.killed]
    report.foreign = [f"pid {h.pid} ({h.name}, {h.whose}) holds {h.path}" for h in result.foreign_holders]
    if not result.ok:
        return _fail(report, f"stop: {result.reason}")
    t1 = time.monotonic()
    verified = await asyncio.to_thread(
        gpu.verify_free,
        list(cfg.gpus),
        list(cfg.device_paths),
        backend,
        sup.gpu_mem_free_threshold_mib,
        sup.release_deadline_s,
        0.05,
        True,
        sup.allowlist,
    )
    report.steps["verify_gpus_free"] = time.monotonic() - t1
    if not verified.ok:
        return _fail(report, f"GPUs not free: {verified.reason}")
    t2 = time.monotonic()
    ports = await asyncio.to_thread(wait_ports_free, cfg, sup.release_deadline_s)
    report.steps["verify_ports_free"] = time.monotonic() - t2
    if not ports.ok:
        return _fail(report, f"ports not free: {ports.reason}")
    swept = await asyncio.to_thread(cleanup.sweep_shm, Path(sup.shm_dir))
    report.swept = [p.name for p in swept]
    report.steps["total"] = time.monotonic() - t0
    report.reason = result.reason + (f"; swept {len(swept)} stale shm file(s)" if swept else "")
    return report


def _fail(report: ReleaseReport, reason: str) -> ReleaseReport:
    report.ok = False
    report.reason = reason
    return report
