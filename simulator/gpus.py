"""Stand-in GPUs: device files the ranks hold open and an NVML-like `nvml.json` the main process updates."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MEMORY_TOTAL_MIB = 143771  # an H200
POWER_LIMIT_W = 700.0


def state_dir() -> Path:
    """The simulator's state directory (`SGLANG_SIM_STATE_DIR`)."""
    default = Path(os.environ.get("TMPDIR", "/tmp")) / "sglang-sim"
    return Path(os.environ.get("SGLANG_SIM_STATE_DIR") or default)


def device_path(gpu: int) -> Path:
    """The stand-in device node of a physical GPU index."""
    return state_dir() / "dev" / f"nvidia{gpu}"


def physical_gpu(local_index: int) -> int:
    """Map a process-local GPU index to the physical one through `CUDA_VISIBLE_DEVICES`, as CUDA does."""
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    if visible and local_index < len(visible) and visible[local_index].isdigit():
        return int(visible[local_index])
    return local_index


def ensure_device(gpu: int) -> Path:
    """Create the stand-in device file if it does not exist yet."""
    path = device_path(gpu)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch(exist_ok=True)
    return path


@dataclass
class GpuLoad:
    """What one GPU is doing right now, as the main process sees its ranks."""

    phase: str  # "loading" | "idle" | "busy" | "spin" | "stopped"
    load_fraction: float  # 0..1 progress of weight loading
    mem_fraction: float  # --mem-fraction-static (or its default)
    pids: list[int]


def sample(gpu: int, load: GpuLoad, rng: random.Random) -> dict[str, Any]:
    """Realistic NVML-like figures for a GPU in a phase."""
    target = int(MEMORY_TOTAL_MIB * load.mem_fraction)
    if load.phase == "stopped":
        util, power, mem = 0.0, 70.0 + rng.uniform(0, 5), 0
    elif load.phase == "loading":
        util, power, mem = rng.uniform(5, 20), rng.uniform(120, 180), int(target * load.load_fraction)
    elif load.phase == "busy":
        util, power, mem = rng.uniform(85, 98), rng.uniform(450, 650), target
    elif load.phase == "spin":
        util, power, mem = rng.uniform(99, 100), rng.uniform(110, 140), target
    else:
        util, power, mem = rng.uniform(0, 3), rng.uniform(90, 120), target
    return {
        "index": gpu,
        "utilization_gpu": round(util, 1),
        "power_w": round(power, 1),
        "power_limit_w": POWER_LIMIT_W,
        "memory_used_mib": mem,
        "memory_total_mib": MEMORY_TOTAL_MIB,
        "pids": list(load.pids) if load.phase != "stopped" else [],
        "xid_events": [],
    }


def publish(samples: list[dict[str, Any]], xids: dict[int, list[dict[str, Any]]] | None = None) -> None:
    """Merge this server's GPUs into `nvml.json` under a file lock (several servers share one state dir)."""
    root = state_dir()
    root.mkdir(parents=True, exist_ok=True)
    path = root / "nvml.json"
    with open(root / "nvml.json.lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        current: dict[str, Any] = {"gpus": []}
        with contextlib.suppress(OSError, ValueError):
            current = json.loads(path.read_text())
        by_index = {int(g["index"]): g for g in current.get("gpus", [])}
        for s in samples:
            previous = by_index.get(int(s["index"]), {})
            s["xid_events"] = list(previous.get("xid_events", [])) + list(
                (xids or {}).get(int(s["index"]), [])
            )
            by_index[int(s["index"])] = s
        data = {"updated_at": time.time(), "gpus": [by_index[k] for k in sorted(by_index)]}
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data))
        os.replace(tmp, path)
