"""A brownout: the server still works, too slowly to keep up, and only gets worse. Pure.

Over the last `brownout_after_s` its waiting queue has only grown (by `MIN_GROWTH` at least, dipping no deeper than
the admissions into its batch) while the running requests stayed pinned (the same count throughout) and its decode
throughput stayed under `brownout_fraction` of its own recent baseline (probes/load.py). Not a wedge — tokens
still come — and a restart (a model reload) may not cure it (a traffic surge, a thermal throttle, a slow neighbour): an incident and an alert
first (`degraded`); a restart only when the server's policy says so (`brownout_policy = "restart"`). It clears when
the last window no longer shows it (the queue drained, the batch moving, throughput back above the fraction).
"""

from __future__ import annotations

from policies.model import Fault, Observation, ProbeSettings, load_values, make_fault
from policies.window import Window

MIN_GROWTH = 2  # waiting requests added over the window: a queue, not a blip
COVERED = 0.9  # of the window the scrapes must cover (a window's worth of history)


def in_brownout(load: Observation, s: ProbeSettings) -> bool:
    """The newest `load` reading shows a brownout."""
    v = load_values(load)
    rate, base, running = v.get("tokens_per_s"), v.get("baseline_tokens_per_s"), float(v.get("running", 0.0))
    return (
        float(v.get("span_s", 0.0)) >= COVERED * s.brownout_after_s
        and bool(v.get("pinned"))
        and running > 0
        and float(v.get("queue_grew", 0.0)) >= MIN_GROWTH
        and float(v.get("queue_dip", 0.0)) <= running  # admissions into the pinned batch, not a drain
        and rate is not None
        and bool(base)
        and rate < s.brownout_fraction * float(base or 0.0)
    )


def brownout(w: Window, s: ProbeSettings) -> Fault | None:
    """`brownout` from the newest `load` reading, or None."""
    load = w.latest("load")
    if load is None or not in_brownout(load, s):
        return None
    v = load_values(load)
    reason = (
        f"queue grew by {float(v.get('queue_grew', 0)):.0f} to {float(v.get('queue', 0)):.0f} in the last "
        f"{float(v.get('span_s', 0)):.0f}s, {float(v.get('running', 0)):.0f} running pinned, "
        f"{float(v.get('tokens_per_s') or 0):.1f} tokens/s against a baseline of "
        f"{float(v.get('baseline_tokens_per_s') or 0):.1f}"
    )
    return make_fault(
        "brownout", reason, 0.7, onset=load.at - float(v.get("span_s", 0.0)), load=dict(v), tags=["brownout"]
    )
