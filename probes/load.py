"""The load trend of a server, from its `/metrics` scrapes: is its queue only growing while its throughput has
fallen far below its own recent baseline, the running requests pinned? (a brownout: `policies.brownout` judges).

Each scrape adds (when, waiting requests `sglang:num_queue_reqs`, running requests `sglang:num_running_reqs`, decode
tokens `sglang:realtime_tokens_total{mode="decode"}`), all summed over ranks, kept `KEEP_S`. Reported over the last
window (`brownout_after_s`): how the queue moved (its growth, and its deepest dip below the highest it had been —
admitting a request lowers it by one), whether the running count stayed the same throughout (both gauges move only
with the scheduler's stats, which a slow scheduler still writes), and the decode throughput; beside it the
baseline, the highest throughput of any `BASELINE_SPAN_S` with requests running in those 30 minutes (a brownout's
own slow spans do not lower it).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from policies.model import LoadValues, Observation
from probes.progress import Sample

KEEP_S = 1800.0
BASELINE_SPAN_S = 10.0  # the throughput of a span this long at least: no single scrape's burst


@dataclass(frozen=True)
class Point:
    at: float
    queue: float
    running: float
    tokens: float


@dataclass
class LoadTrend:
    """The scrapes of this launch, as far back as `KEEP_S`."""

    points: deque[Point] = field(default_factory=lambda: deque(maxlen=4096))

    def reset(self) -> None:
        """A new launch: counters restart, no baseline yet."""
        self.points.clear()

    def update(self, samples: list[Sample] | None, now: float, window_s: float) -> Observation | None:
        """Fold one scrape in and report the last `window_s` (probe `load`); None when the scrape failed or lacks
        the gauges."""
        if samples is None:
            return None
        queue = _sum(samples, "sglang:num_queue_reqs")
        running = _sum(samples, "sglang:num_running_reqs")
        tokens = sum(
            s.value
            for s in samples
            if s.name == "sglang:realtime_tokens_total" and s.labels.get("mode") == "decode"
        )
        if queue is None or running is None:
            return None
        self.points.append(Point(now, queue, running, tokens))
        while self.points and self.points[0].at < now - KEEP_S:
            self.points.popleft()
        return self._observe(now, window_s)

    def _observe(self, now: float, window_s: float) -> Observation:
        pts = list(self.points)
        recent = [p for p in pts if p.at >= now - window_s] or pts[-1:]
        first, newest = recent[0], recent[-1]
        peak, dip = first.queue, 0.0
        for p in recent:
            peak = max(peak, p.queue)
            dip = max(dip, peak - p.queue)
        values: LoadValues = {
            "queue": newest.queue,
            "running": newest.running,
            "span_s": round(newest.at - first.at, 3),
            "pinned": all(p.running == newest.running for p in recent),
            "queue_grew": newest.queue - first.queue,
            "queue_dip": dip,
            "tokens_per_s": round(_rate(first, newest), 3) if newest.at > first.at else None,
            "baseline_tokens_per_s": _baseline(pts),
        }
        detail = f"queue {newest.queue:.0f}, running {newest.running:.0f}, {values['tokens_per_s']} tokens/s"
        return Observation("load", now, True, detail, 0.0, dict(values))


def _sum(samples: list[Sample], name: str) -> float | None:
    found = [s.value for s in samples if s.name == name]
    return sum(found) if found else None


def _rate(a: Point, b: Point) -> float:
    return max(0.0, b.tokens - a.tokens) / max(b.at - a.at, 1e-9)


def _baseline(pts: list[Point]) -> float | None:
    """The highest throughput over any `BASELINE_SPAN_S` with requests running (None before there is one)."""
    best: float | None = None
    first = 0
    for last, b in enumerate(pts):
        while first < last and b.at - pts[first + 1].at >= BASELINE_SPAN_S:
            first += 1
        a = pts[first]
        if b.at - a.at >= BASELINE_SPAN_S and a.running > 0 and b.running > 0:
            best = max(best or 0.0, _rate(a, b))
    return round(best, 3) if best is not None else None
