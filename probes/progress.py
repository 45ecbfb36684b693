"""The progress lease: is work in flight, and are tokens still being produced?

SGLang's batch gauges freeze at their last values when the scheduler wedges, and token totals move only when a
request finishes, so neither is a liveness signal (sglang-internals.md §2). The counters that tick on every
forward are: `realtime_tokens_total` (decode and prefill modes), `inter_token_latency_seconds_count` (tokens that
reached the API) and `cuda_graph_passes_total`. Work in flight is: generation requests active at the HTTP layer,
our own outstanding canary, or (when the HTTP gauge is absent) a non-zero running gauge. Work with no progress
for `stall_after_s` is a stall. Log batch lines and a GPU drawing real power also count as progress.

While SGLang reports its engine paused by its client (probes/engine.py) the lease is held: neither the stall
clock nor the PD queue's runs, so a pause of any length ends with a fresh `stall_after_s` for the engine to
produce tokens again.
"""

from __future__ import annotations

import asyncio
import re
import time
from dataclasses import dataclass, field

import aiohttp

from policies.model import Observation, ProgressValues
from probes.base import auth_headers, read_capped
from probes.loads import PdLoads

GENERATION_ENDPOINTS = frozenset(
    {"/generate", "/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages"}
)
PD_QUEUES = {
    "decode": ("sglang:num_decode_transfer_queue_reqs", "sglang:num_decode_prealloc_queue_reqs"),
    "prefill": ("sglang:num_prefill_inflight_queue_reqs", "sglang:num_prefill_bootstrap_queue_reqs"),
}
# counters of requests' tokens, kept by SGLang's tokenizer (its health check is not counted: log_metrics=False)
REQUEST_TOKENS = frozenset({"first_tokens", "streamed_tokens", "generation_tokens_total"})
_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)")
METRICS_TYPES = ("text/plain", "application/openmetrics-text")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True)
class Sample:
    """One series of a Prometheus text exposition."""

    name: str
    labels: dict[str, str]
    value: float


def parse_metrics(text: str) -> list[Sample]:
    """Samples of a Prometheus text body; comments and malformed lines are skipped."""
    samples: list[Sample] = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = _LINE.match(line)
        if match is None:
            continue
        try:
            value = float(match.group(3))
        except ValueError:
            continue
        labels = dict(_LABEL.findall(match.group(2) or ""))
        samples.append(Sample(match.group(1), labels, value))
    return samples


def progress_counters(samples: list[Sample]) -> dict[str, float]:
    """The counters that move only when the engine runs a forward, summed over ranks."""
    out: dict[str, float] = {}

    def add(key: str, value: float) -> None:
        out[key] = out.get(key, 0.0) + value

    for s in samples:
        mode = s.labels.get("mode", "")
        if s.name == "sglang:realtime_tokens_total":
            add("decode_tokens" if mode == "decode" else "prefill_tokens", s.value)
        elif s.name == "sglang:inter_token_latency_seconds_count":
            add("streamed_tokens", s.value)
        elif s.name == "sglang:time_to_first_token_seconds_count":
            add("first_tokens", s.value)
        elif s.name == "sglang:cuda_graph_passes_total":
            add("decode_passes" if mode.startswith("decode") else "prefill_passes", s.value)
        elif s.name in ("sglang:prompt_tokens_total", "sglang:generation_tokens_total"):
            add(s.name.removeprefix("sglang:"), s.value)
    return out


def _gauge(samples: list[Sample], names: tuple[str, ...] | str) -> float | None:
    wanted = (names,) if isinstance(names, str) else names
    found = [s.value for s in samples if s.name in wanted]
    return sum(found) if found else None


@dataclass
class ProgressTracker:
    """State across scrapes: last counters, when progress last moved, since when work has been waiting."""

    role: str = "unified"
    counters: dict[str, float] = field(default_factory=dict)
    last_progress_at: float | None = None
    work_since: float | None = None
    pd_since: float | None = None
    idle_at: float | None = None
    pd_last: float = 0.0  # the PD queue at the newest scrape
    pd_held: float | None = None  # the PD queue when the supervisor restarted its stand (None: not restarted)
    pd_aborts: int = 0  # how many times in a row the supervisor restarted this stand without freeing it

    def reset(self, now: float) -> None:
        """A new launch: counters restart from zero, progress counts from now."""
        self.counters, self.last_progress_at, self.work_since = {}, now, None
        self.pd_since, self.idle_at, self.pd_last, self.pd_held, self.pd_aborts = None, None, 0.0, None, 0

    def restart_pd(self, now: float) -> None:
        """The supervisor acted on the PD queue (it aborted the requests in it): a queue still standing counts
        from now, so the action is judged after a whole window of its own. A queue seen shorter than it was then, or
        a request's token since, took the action: what stands after that is a new stand (`pd_aborts` 0
        again; a gateway's retries refill the queue within a scrape, so the shorter queue alone may go unseen).
        `pd_aborts` counts the restarts of one stand that freed nothing."""
        if self.pd_since is not None:
            self.pd_since, self.pd_held, self.pd_aborts = now, self.pd_last, self.pd_aborts + 1

    def update(
        self,
        samples: list[Sample] | None,
        now: float,
        *,
        canary_outstanding: bool = False,
        other_progress_at: float | None = None,
        error: str = "",
        latency_s: float | None = None,
        paused: bool = False,
        pd_live: PdLoads | None = None,
    ) -> Observation:
        """Fold one scrape (None when it failed) into the lease and report it; `paused` holds the lease; a PD
        worker's live queues (`/v1/loads`) stand in for its gauges, which go stale while nothing runs."""
        moved: list[str] = []
        running = active = pd_queue = queued = pd_waiting = None
        if samples is not None:
            counters = progress_counters(samples)
            moved = [k for k, v in counters.items() if v != self.counters.get(k, 0.0)]
            self.counters = counters
            running = _gauge(samples, "sglang:num_running_reqs")
            active_series = [s for s in samples if s.name == "sglang:http_requests_active"]
            if active_series:
                active = sum(
                    s.value for s in active_series if s.labels.get("endpoint") in GENERATION_ENDPOINTS
                )
            pd_queue = _gauge(samples, PD_QUEUES.get(self.role, ()))
            queued = _gauge(samples, "sglang:num_queue_reqs")
            if pd_live is not None:
                pd_queue, running, pd_waiting = pd_live.queue, pd_live.running, pd_live.waiting
        if moved or paused:
            self.last_progress_at = now
        if other_progress_at is not None and (self.last_progress_at or 0.0) < other_progress_at:
            self.last_progress_at = other_progress_at
        reasons = [r for r, on in self._work(running, active, canary_outstanding) if on]
        if reasons and self.work_since is None:
            self.work_since = now
        if not reasons:
            self.work_since = None
        stalled = now - max(self.work_since or now, self.last_progress_at or now) if reasons else 0.0
        pd_stalled = self._pd(pd_queue, moved, now, paused)
        # idle: no work (the running gauge counts only without the live HTTP gauge: it goes stale when idle)
        if samples is not None and not (reasons or queued or pd_queue):
            self.idle_at = now
        values: ProgressValues = {
            "scrape_ok": samples is not None,
            "work": bool(reasons),
            "work_reasons": reasons,
            "stalled_s": round(max(stalled, 0.0), 3),
            "last_progress_at": self.last_progress_at,
            "moved": moved,
            "running": running,
            "active_gen": active,
            "canary_outstanding": canary_outstanding,
            "pd_queue": pd_queue,
            "pd_waiting": pd_waiting,
            "pd_stalled_s": round(pd_stalled, 3),
            "pd_aborts": self.pd_aborts if self.pd_held is not None else 0,
            "idle_at": self.idle_at,
            "counters": dict(self.counters),
        }
        if samples is None:
            detail = f"metrics unavailable: {error}"
        elif paused:
            detail = "engine paused by its client: the lease is held"
        elif reasons:
            detail = (
                f"work in flight ({', '.join(reasons)}); no progress for {stalled:.1f}s"
                if stalled > 0
                else (f"work in flight, progressing ({', '.join(moved) or 'other signals'})")
            )
        else:
            detail = "idle"
        return Observation("progress", now, samples is not None, detail, latency_s, values)

    @staticmethod
    def _work(running: float | None, active: float | None, canary: bool) -> list[tuple[str, bool]]:
        return [
            ("generation_requests_active", bool(active)),
            ("canary_outstanding", canary),
            ("num_running_reqs", active is None and bool(running)),
        ]

    def _pd(self, queue: float | None, moved: list[str], now: float, paused: bool = False) -> float:
        """Seconds a non-zero PD queue has stood without a request's token.

        A shrinking queue is not progress by itself: aborted and timed-out requests leave it too (F3 begins
        with an abort burst). Nor are the scheduler's decode counters: SGLang's own `/health` check decodes a
        token with a fake bootstrap, past the transfer queue. Tokens of requests (first tokens, inter-token
        counts, finished requests: the tokenizer's counters, which skip the health check) are.
        """
        self.pd_last = queue or 0.0
        if not queue:
            self.pd_since, self.pd_held, self.pd_aborts = None, None, 0
            return 0.0
        tokens = any(m in REQUEST_TOKENS for m in moved)
        if self.pd_held is not None and (queue < self.pd_held or tokens):
            self.pd_since, self.pd_held, self.pd_aborts = None, None, 0
        if self.pd_since is None or paused or tokens:
            self.pd_since = now
        return now - self.pd_since


async def scrape_metrics(
    session: aiohttp.ClientSession,
    base_url: str,
    timeout_s: float,
    max_bytes: int,
    api_key: str | None = None,
) -> tuple[list[Sample] | None, str, float]:
    """GET /metrics with a timeout and a byte cap: (samples or None, error, latency).

    A body that is not a Prometheus exposition (wrong content type), longer than `max_bytes`, or cut short
    is a failed scrape, never a partial one. Parsing runs in a thread: a large body must not stall the loop.
    """
    start = time.monotonic()
    try:
        async with session.get(
            f"{base_url}/metrics",
            headers=auth_headers(api_key),
            timeout=aiohttp.ClientTimeout(total=timeout_s),
        ) as resp:
            if resp.status != 200:
                return None, f"HTTP {resp.status}", time.monotonic() - start
            if resp.content_type not in METRICS_TYPES:
                return None, f"content type {resp.content_type[:60]!r}", time.monotonic() - start
            body = await read_capped(resp, max_bytes + 1)
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        return None, type(exc).__name__, time.monotonic() - start
    if len(body) > max_bytes:
        return None, f"body over {max_bytes} bytes", time.monotonic() - start
    samples = await asyncio.to_thread(parse_metrics, body.decode("utf-8", "replace"))
    return samples, "", time.monotonic() - start
