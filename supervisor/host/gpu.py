"""GPU release: who holds our device nodes, what the GPU backend says, and polling until they are free.

Holders come from a scan of ``/proc/*/fd`` links (optionally ``/proc/*/maps``), cross-checked with the
real ``fuser`` when it is installed (read-only: ``fuser -a``; never ``-k``). Backends: ``nvml`` (the real
card, nvidia-ml-py imported lazily), ``sim`` (the simulator's ``nvml.json``), ``none``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import psutil

from supervisor.host import openfiles, proctree

_NVML_JSON_LIMIT = 1024 * 1024
_FUSER_TIMEOUT_S = 5.0
_XID_KEEP = 16


class GpuBackendUnavailable(Exception):
    """The chosen GPU backend cannot run here (library or driver absent, state file missing)."""


@dataclass(frozen=True)
class XidEvent:
    """One Xid error reported by the driver; ``at`` is unix seconds."""

    xid: int
    at: float


@dataclass(frozen=True)
class GpuSample:
    """One GPU at one moment, as the backend reports it."""

    index: int
    utilization_pct: float
    power_w: float
    memory_used_mib: float
    memory_total_mib: float
    pids: tuple[int, ...]
    xid_events: tuple[XidEvent, ...] = ()
    power_limit_w: float = 0.0

    def to_json(self) -> dict[str, Any]:
        """The nvml.json-shaped dict the probes read."""
        return {
            "index": self.index,
            "utilization_gpu": self.utilization_pct,
            "power_w": self.power_w,
            "power_limit_w": self.power_limit_w,
            "memory_used_mib": self.memory_used_mib,
            "memory_total_mib": self.memory_total_mib,
            "pids": list(self.pids),
            "xid_events": [{"xid": x.xid, "at": x.at} for x in self.xid_events],
        }


@dataclass(frozen=True)
class Holder:
    """A process holding a device path open; ``whose`` says which run or which user it belongs to."""

    pid: int
    path: Path
    name: str
    whose: str
    source: str  # "proc" | "fuser" | "proc+fuser"


@dataclass(frozen=True)
class VerifyResult:
    """Outcome of ``verify_free``: ok, or the reason naming the GPU, the holder and whose it is."""

    ok: bool
    reason: str
    elapsed_s: float
    holders: tuple[Holder, ...] = ()
    samples: tuple[GpuSample, ...] = field(default=())


class GpuBackend(Protocol):
    """Reads utilisation, power, memory, compute PIDs and Xid events of the given GPUs."""

    name: str

    def snapshot(self, gpus: Sequence[int]) -> list[GpuSample]: ...


def fuser_holders(paths: Sequence[Path]) -> dict[Path, set[int]] | None:
    """PIDs ``fuser -a`` reports on each path, or None when fuser is not installed."""
    running = _start_fusers(paths)
    return None if running is None else _collect_fusers(running)


def _start_fusers(paths: Sequence[Path]) -> dict[Path, subprocess.Popen[bytes]] | None:
    """One ``fuser -a`` per path, all at once: each reads every process's open files, so serial runs add up."""
    fuser = shutil.which("fuser")
    if fuser is None:
        return None
    running: dict[Path, subprocess.Popen[bytes]] = {}
    try:
        for path in paths:
            running[Path(path)] = subprocess.Popen(
                [fuser, "-a", str(path)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
            )
    except OSError:
        _collect_fusers(running)
        return None
    return running


def _collect_fusers(running: dict[Path, subprocess.Popen[bytes]]) -> dict[Path, set[int]] | None:
    """Each fuser's PIDs; None when one failed or outlived the timeout (all are reaped either way)."""
    deadline = time.monotonic() + _FUSER_TIMEOUT_S
    found: dict[Path, set[int]] | None = {}
    for path, proc in running.items():
        try:
            out, _ = proc.communicate(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            found = None
            continue
        if found is not None:
            found[path] = parse_fuser_output(out.decode("ascii", "replace"))
    return found


def parse_fuser_output(text: str) -> set[int]:
    """PIDs from fuser's stdout (``  123  456m``); access letters and names go to stderr."""
    pids = set()
    for token in text.split():
        digits = token.rstrip("cefFrm")
        if digits.isdigit():
            pids.add(int(digits))
    return pids


def device_holders(
    paths: Sequence[Path], use_fuser: bool = True, allowlist: Sequence[str] = proctree.DEFAULT_ALLOWLIST
) -> list[Holder]:
    """Live processes holding ``paths`` (``/proc`` scan, plus ``fuser`` if present), allowlist excepted."""
    running = _start_fusers(paths) if use_fuser else None
    scanned = openfiles.open_holders(paths)  # while the fusers run
    fused = _collect_fusers(running) if running is not None else None
    holders = []
    for path, proc_pids in scanned.items():
        fuser_pids = fused.get(path, set()) if fused is not None else set()
        for pid in sorted(proc_pids | fuser_pids):
            if not proctree.is_alive(pid) or proctree.is_protected(pid, allowlist):
                continue
            both = pid in proc_pids and pid in fuser_pids
            source = "proc+fuser" if both else ("proc" if pid in proc_pids else "fuser")
            holders.append(Holder(pid, path, proctree.display_name(pid), describe_owner(pid), source))
    return holders


def describe_owner(pid: int) -> str:
    """``run <id> of server <name>`` for a marked process, else ``foreign (user <u>)``."""
    markers = proctree.read_markers(pid)
    if proctree.RUN_MARKER in markers:
        server = markers.get(proctree.SERVER_MARKER, "?")
        return f"run {markers[proctree.RUN_MARKER]} of server {server}"
    try:
        user = psutil.Process(pid).username()
    except (psutil.Error, KeyError):
        user = "?"
    return f"foreign (user {user})"


class NoneBackend:
    """No GPU telemetry: only device-node holders are checked."""

    name = "none"

    def snapshot(self, gpus: Sequence[int]) -> list[GpuSample]:
        return []


class SimBackend:
    """Reads the simulator's ``nvml.json`` (schema in docs/contracts.md).

    Like the real driver, memory of a process that has died is free: PIDs no longer alive are dropped, and a
    GPU with no live process reports no memory in use (the simulator publishes a load before it knows the ranks' PIDs).
    """

    name = "sim"

    def __init__(self, state_dir: Path) -> None:
        self.path = Path(state_dir) / "nvml.json"

    def snapshot(self, gpus: Sequence[int]) -> list[GpuSample]:
        if not self.path.exists():
            return [_sim_sample(index, {}) for index in gpus]  # nothing ever ran on these stand-in GPUs
        try:
            with open(self.path, "rb") as fh:
                data = json.loads(fh.read(_NVML_JSON_LIMIT))
            entries = {int(g["index"]): g for g in data["gpus"]}
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise GpuBackendUnavailable(f"gpu backend 'sim': cannot read {self.path}: {exc}") from exc
        return [_sim_sample(index, entries.get(index, {})) for index in gpus]


class NvmlBackend:
    """The real card through NVML; Xid critical errors are collected from an event set when supported."""

    name = "nvml"

    def __init__(self) -> None:
        try:
            import pynvml
        except ImportError as exc:
            raise GpuBackendUnavailable(
                "gpu backend 'nvml' needs the nvidia-ml-py package (import pynvml failed)"
            ) from exc
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise GpuBackendUnavailable(
                f"gpu backend 'nvml': NVML did not initialise ({exc}); is the NVIDIA driver loaded?"
            ) from exc
        self._nvml: Any = pynvml
        self._xids: dict[int, list[XidEvent]] = {}
        self._events: Any = self._register_xid_events()

    def snapshot(self, gpus: Sequence[int]) -> list[GpuSample]:
        nv = self._nvml
        self._drain_xid_events()
        samples = []
        for index in gpus:
            try:
                handle = nv.nvmlDeviceGetHandleByIndex(index)
                memory = nv.nvmlDeviceGetMemoryInfo(handle)
                procs = nv.nvmlDeviceGetComputeRunningProcesses(handle)
                samples.append(
                    GpuSample(
                        index=index,
                        utilization_pct=float(nv.nvmlDeviceGetUtilizationRates(handle).gpu),
                        power_w=nv.nvmlDeviceGetPowerUsage(handle) / 1000.0,
                        memory_used_mib=memory.used / 2**20,
                        memory_total_mib=memory.total / 2**20,
                        pids=tuple(sorted(int(p.pid) for p in procs)),
                        xid_events=tuple(self._xids.get(index, ())),
                        power_limit_w=nv.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000.0,
                    )
                )
            except nv.NVMLError as exc:
                raise GpuBackendUnavailable(f"gpu backend 'nvml': GPU {index}: {exc}") from exc
        return samples

    def _register_xid_events(self) -> Any:
        nv = self._nvml
        try:
            event_set = nv.nvmlEventSetCreate()
            for index in range(nv.nvmlDeviceGetCount()):
                handle = nv.nvmlDeviceGetHandleByIndex(index)
                nv.nvmlDeviceRegisterEvents(handle, nv.nvmlEventTypeXidCriticalError, event_set)
        except nv.NVMLError:
            return None
        return event_set

    def _drain_xid_events(self) -> None:
        nv = self._nvml
        while self._events is not None:
            try:
                data = nv.nvmlEventSetWait_v2(self._events, 0)
                index = int(nv.nvmlDeviceGetIndex(data.device))
            except nv.NVMLError:
                return
            events = self._xids.setdefault(index, [])
            events.append(XidEvent(int(data.eventData), time.time()))
            del events[:-_XID_KEEP]


def open_backend(kind: str, sim_state_dir: Path | None = None) -> GpuBackend:
    """The backend named ``nvml`` / ``sim`` / ``none``; raises ``GpuBackendUnavailable`` with why not."""
    if kind == "none":
        return NoneBackend()
    if kind == "sim":
        if sim_state_dir is None:
            raise GpuBackendUnavailable("gpu backend 'sim' needs the simulator state dir")
        return SimBackend(sim_state_dir)
    if kind == "nvml":
        return NvmlBackend()
    raise GpuBackendUnavailable(f"unknown gpu backend {kind!r}; allowed: nvml, sim, none")


def verify_free(
    gpus: Sequence[int],
    paths: Sequence[Path],
    backend: GpuBackend,
    mem_threshold_mib: float,
    deadline_s: float,
    poll_s: float = 0.05,
    use_fuser: bool = True,
    allowlist: Sequence[str] = proctree.DEFAULT_ALLOWLIST,
) -> VerifyResult:
    """Poll until no process holds ``paths`` and each GPU has no compute PIDs and memory under threshold."""
    start = time.monotonic()
    while True:
        holders = device_holders(paths, use_fuser, allowlist)
        samples: list[GpuSample] = []
        problems = [f"{h.path} held by pid {h.pid} ({h.name}, {h.whose})" for h in holders]
        try:
            samples = backend.snapshot(gpus)
        except GpuBackendUnavailable as exc:
            problems.append(str(exc))
        problems += _busy_gpus(samples, mem_threshold_mib)
        elapsed = time.monotonic() - start
        if not problems:
            return VerifyResult(True, "free", elapsed, (), tuple(samples))
        if elapsed >= deadline_s:
            reason = f"not free after {elapsed:.1f}s: " + "; ".join(problems)
            return VerifyResult(False, reason, elapsed, tuple(holders), tuple(samples))
        time.sleep(min(poll_s, max(0.0, deadline_s - elapsed)))


def _busy_gpus(samples: Sequence[GpuSample], mem_threshold_mib: float) -> list[str]:
    problems = []
    for s in samples:
        if s.pids:
            owners = ", ".join(f"pid {p} ({proctree.display_name(p)}, {describe_owner(p)})" for p in s.pids)
            problems.append(f"GPU {s.index} has compute processes: {owners}")
        if s.memory_used_mib >= mem_threshold_mib:
            problems.append(
                f"GPU {s.index} memory used {s.memory_used_mib:.0f} MiB ≥ threshold {mem_threshold_mib:.0f} MiB"
            )
    return problems


def _sim_sample(index: int, entry: dict[str, Any]) -> GpuSample:
    listed = [int(p) for p in entry.get("pids", [])]
    live = tuple(p for p in listed if proctree.is_alive(p))
    memory_used = float(entry.get("memory_used_mib", 0.0))
    if not live:
        memory_used = 0.0  # the driver frees a GPU's memory when no process of it is left
    xids = tuple(XidEvent(int(x["xid"]), float(x["at"])) for x in entry.get("xid_events", []))
    return GpuSample(
        index=index,
        utilization_pct=float(entry.get("utilization_gpu", 0.0)) if live else 0.0,
        power_w=float(entry.get("power_w", 0.0)),
        memory_used_mib=memory_used,
        memory_total_mib=float(entry.get("memory_total_mib", 0.0)),
        pids=live,
        xid_events=xids,
        power_limit_w=float(entry.get("power_limit_w", 0.0)),
    )
