"""`startup_stalled`: a launch that stopped making progress before serving. Pure.

Progress is the newest of a startup log line (shards, graph capture, JIT) and the metrics lease: no progress for
`startup_silence_s` is a stall; the startup budget (`startup_budget_s`, extended while progress keeps coming) spent
is one too.
"""

from __future__ import annotations

from policies.model import Fault, ProbeSettings, logs_values, make_fault
from policies.window import Window


def startup_stalled(w: Window, started_at: float, s: ProbeSettings, now: float) -> Fault | None:
    """The stall of a launch that started at `started_at` (monotonic), or None."""
    last = max(started_at, w.last_progress_at() or started_at)
    silent = now - last
    deadline = max(started_at + s.startup_budget_s, last + s.startup_silence_s)
    logs = w.latest("logs")
    evidence = {
        "silent_s": round(silent, 1),
        "progress_line": logs_values(logs).get("progress_line") if logs else None,
    }
    if silent >= s.startup_silence_s:
        return make_fault(
            "startup_stalled", f"no startup progress for {silent:.0f}s", 0.8, onset=last, startup=evidence
        )
    if now >= deadline:
        return make_fault(
            "startup_stalled",
            f"startup budget of {s.startup_budget_s:.0f}s spent",
            0.8,
            onset=started_at + s.startup_budget_s,
            startup=evidence,
        )
    return None
