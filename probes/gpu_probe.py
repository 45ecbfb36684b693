"""Per-GPU utilisation, power, memory, pids and Xid events (dicts as in docs/contracts.md `nvml.json`).

Two shapes matter: the *spin* signature — utilisation ≥ 95 % at ≤ 35 % of the power limit — is a kernel polling a
flag that never flips (custom all-reduce, a rank waiting in a collective; failure-modes.md H1/H9); *busy* —
high utilisation at real power — is real compute, which counts as progress during a long prefill. Xid events
are reported once each: fatal ones (48, 62, 63, 64, 74, 79, 92, 94, 95) are a `gpu_fault`, 13/31/43 crash evidence.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from policies.model import GpuValues, Observation, XidEvent

SPIN_UTIL_PCT = 95.0
SPIN_POWER_FRACTION = 0.35
BUSY_UTIL_PCT = 80.0
BUSY_POWER_FRACTION = 0.5
XID_MAX_AGE_S = 60.0  # events older than this when the watch starts belong to an earlier incident


def _num(entry: dict[str, Any], key: str) -> float:
    try:
        return float(entry.get(key) or 0.0)
    except (TypeError, ValueError):
        return 0.0


@dataclass
class GpuWatch:
    """Remembers which Xid events were already reported (`seen` may be shared by a server's launches)."""

    started_wall: float = field(default_factory=time.time)
    seen: set[tuple[int, int, float]] = field(default_factory=set)

    def observe(self, read: Callable[[], list[dict[str, Any]]], now: float) -> Observation:
        """Read the GPUs once (probe `gpu`); a failing reader gives ok=False."""
        start = time.monotonic()
        try:
            gpus = read()
        except Exception as exc:  # a probe never raises into the loop
            return Observation(
                "gpu", now, False, f"GPU read failed: {type(exc).__name__}: {exc}"[:200], None, {}
            )
        summary: list[dict[str, Any]] = []
        spin: list[int] = []
        busy: list[int] = []
        xids: list[XidEvent] = []
        for g in gpus:
            index = int(_num(g, "index"))
            util, power, limit = _num(g, "utilization_gpu"), _num(g, "power_w"), _num(g, "power_limit_w")
            summary.append(
                {
                    "index": index,
                    "util": util,
                    "power_w": power,
                    "power_limit_w": limit,
                    "mem_used_mib": _num(g, "memory_used_mib"),
                    "pids": list(g.get("pids") or []),
                }
            )
            if limit > 0 and util >= SPIN_UTIL_PCT and power <= SPIN_POWER_FRACTION * limit:
                spin.append(index)
            elif limit > 0 and util >= BUSY_UTIL_PCT and power >= BUSY_POWER_FRACTION * limit:
                busy.append(index)
            for event in g.get("xid_events") or []:
                key = (index, int(_num(event, "xid")), _num(event, "at"))
                if key in self.seen or key[2] < self.started_wall - XID_MAX_AGE_S:
                    continue
                self.seen.add(key)
                xids.append({"index": index, "xid": key[1], "at": key[2]})
        parts = [f"{len(gpus)} GPUs"]
        if spin:
            parts.append(f"spinning {spin}")
        if xids:
            parts.append("Xid " + ", ".join(f"{x['xid']}@GPU{x['index']}" for x in xids))
        values: GpuValues = {"gpus": summary, "spin": spin, "busy": busy, "xids": xids}
        return Observation("gpu", now, not xids, "; ".join(parts), time.monotonic() - start, values)
