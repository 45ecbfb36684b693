"""The dispatcher that delivers incidents to alert sinks without ever blocking the loop.

`AlertDispatcher.fire(incident)` / `.resolve(incident)` only enqueue (one bounded queue per sink; a full
queue drops and counts). A worker task per sink rate-limits, posts with a per-attempt timeout and retries
network errors, timeouts, 408, 429 and 5xx with exponential backoff and jitter (tenacity); other 4xx are
final. Every outcome is counted in `sglang_supervisor_alert_deliveries_total{sink,outcome}`.

The sinks and the secret readers live in `payloads` and are re-exported here: import them from this module.
Log lines and errors name the sink, never a URL or key.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import aiohttp
import structlog
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_attempt
from tenacity.wait import wait_exponential_jitter

from supervisor.alerts import payloads
from supervisor.alerts.payloads import (
    AlertmanagerSink,
    AlertSink,
    PagerDutySink,
    SlackSink,
    WebhookSink,
    secret_from_env,
    secret_from_file,
    verify_signature,
)
from supervisor.records.incident import Incident
from supervisor.reporting.metrics import SupervisorMetrics

__all__ = [
    "AlertDispatcher",
    "AlertSink",
    "AlertmanagerSink",
    "DeliveryError",
    "PagerDutySink",
    "SlackSink",
    "TokenBucket",
    "WebhookSink",
    "secret_from_env",
    "secret_from_file",
    "verify_signature",
]

log = structlog.get_logger("supervisor.alerts.dispatcher")

_MAX_RESPONSE_BYTES = 4096
_RETRYABLE_STATUS = frozenset({408, 429, 500, 502, 503, 504})


class DeliveryError(Exception):
    """A failed delivery attempt; the message never holds a URL or a secret."""

    def __init__(self, message: str, retryable: bool, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.retry_after_s = retry_after_s


class TokenBucket:
    """Rate limit: `rate_per_min` deliveries a minute, bursts of up to a sixth of that (at least 1)."""

    def __init__(self, rate_per_min: float, clock: Callable[[], float]) -> None:
        if rate_per_min <= 0:
            raise ValueError(f"rate_limit_per_min must be > 0, got {rate_per_min}")
        self._rate_per_s = rate_per_min / 60.0
        self._capacity = max(1.0, rate_per_min / 6.0)
        self._tokens = self._capacity
        self._clock = clock
        self._updated = clock()

    def reserve(self) -> float:
        """Take one token; return how many seconds to wait before using it (0 when one was available)."""
        now = self._clock()
        self._tokens = min(self._capacity, self._tokens + (now - self._updated) * self._rate_per_s)
        self._updated = now
        self._tokens -= 1.0
        return 0.0 if self._tokens >= 0 else -self._tokens / self._rate_per_s


def _retry_after(value: str | None) -> float | None:
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None


@dataclass
class _Lane:
    sink: AlertSink
    queue: asyncio.Queue[tuple[Incident, str]]
    bucket: TokenBucket
    task: asyncio.Task[None] | None = None


class AlertDispatcher:
    """Fan incidents out to sinks through bounded queues; never blocks, never raises into the caller."""

    def __init__(
        self,
        sinks: Sequence[AlertSink],
        queue_size: int = 256,
        rate_limit_per_min: float = 30.0,
        metrics: SupervisorMetrics | None = None,
        *,
        attempt_timeout_s: float = 10.0,
        max_attempts: int = 5,
        backoff_initial_s: float = 1.0,
        backoff_max_s: float = 60.0,
    ) -> None:
        if queue_size < 1:
            raise ValueError(f"queue_size must be >= 1, got {queue_size}")
        names = [s.name for s in sinks]
        if len(set(names)) != len(names):
            raise ValueError(f"sink names must be unique, got {names}")
        self._lanes = [
            _Lane(s, asyncio.Queue(maxsize=queue_size), TokenBucket(rate_limit_per_min, time.monotonic))
            for s in sinks
        ]
        self._metrics = metrics
        self._timeout_s = attempt_timeout_s
        self._max_attempts = max_attempts
        self._backoff = wait_exponential_jitter(
            multiplier=backoff_initial_s, max=backoff_max_s, jitter=backoff_initial_s
        )
        self._backoff_max_s = backoff_max_s
        self._session: aiohttp.ClientSession | None = None
        for s in sinks:
            if metrics is not None:
                metrics.declare_sink(s.name)

    def fire(self, incident: Incident) -> None:
        """Queue a firing alert for every sink; returns at once."""
        self._enqueue(incident, payloads.FIRING)

    def resolve(self, incident: Incident) -> None:
        """Queue a resolved alert for every sink; returns at once."""
        self._enqueue(incident, payloads.RESOLVED)

    async def start(self) -> None:
        """Open the HTTP session and start one worker per sink."""
        if self._session is not None:
            return
        self._session = aiohttp.ClientSession(headers={"User-Agent": "sglang-supervisor"})
        for lane in self._lanes:
            lane.task = asyncio.create_task(self._work(lane), name=f"alerts.{lane.sink.name}")

    async def aclose(self, timeout_s: float = 5.0) -> None:
        """Deliver what is queued within `timeout_s`, then stop; what is left is counted as dropped."""
        if self._session is None:
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await asyncio.gather(*(lane.queue.join() for lane in self._lanes))
        for lane in self._lanes:
            if lane.task is not None:
                lane.task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await lane.task
                lane.task = None
            while not lane.queue.empty():
                incident, status = lane.queue.get_nowait()
                self._count(lane.sink, "dropped")
                log.warning("alert.dropped", sink=lane.sink.name, incident=incident.id, status=status)
        await self._session.close()
        self._session = None

    def _enqueue(self, incident: Incident, status: str) -> None:
        incident = incident.redacted()  # no key in argv, evidence or reason reaches a sink
        for lane in self._lanes:
            try:
                lane.queue.put_nowait((incident, status))
            except asyncio.QueueFull:
                self._count(lane.sink, "dropped")
                log.warning(
                    "alert.dropped",
                    sink=lane.sink.name,
                    incident=incident.id,
                    status=status,
                    why="queue full",
                )

    def _count(self, sink: AlertSink, outcome: str) -> None:
        if self._metrics is not None:
            self._metrics.alert_delivery(sink.name, outcome)

    async def _work(self, lane: _Lane) -> None:
        while True:
            incident, status = await lane.queue.get()
            try:
                delay = lane.bucket.reserve()
                if delay > 0:
                    await asyncio.sleep(delay)
                await self._deliver(lane.sink, incident, status)
            except asyncio.CancelledError:
                self._count(lane.sink, "failed")
                raise
            finally:
                lane.queue.task_done()

    def _wait(self, state: RetryCallState) -> float:
        backoff = self._backoff(state)
        exc = state.outcome.exception() if state.outcome is not None else None
        if isinstance(exc, DeliveryError) and exc.retry_after_s is not None:
            return max(backoff, min(exc.retry_after_s, self._backoff_max_s))
        return backoff

    async def _deliver(self, sink: AlertSink, incident: Incident, status: str) -> None:
        bound = log.bind(sink=sink.name, incident=incident.id, status=status)

        def before_sleep(state: RetryCallState) -> None:
            exc = state.outcome.exception() if state.outcome is not None else None
            bound.info("alert.retrying", attempt=state.attempt_number, error=str(exc))

        retrying = AsyncRetrying(
            stop=stop_after_attempt(self._max_attempts),
            wait=self._wait,
            retry=retry_if_exception(lambda e: isinstance(e, DeliveryError) and e.retryable),
            before_sleep=before_sleep,
            reraise=True,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    await self._post(sink, incident, status)
        except DeliveryError as exc:
            self._count(sink, "failed")
            bound.warning("alert.delivery_failed", error=str(exc), retryable=exc.retryable)
        except Exception as exc:  # a bug in one sink must not kill its worker
            self._count(sink, "failed")
            bound.error("alert.delivery_failed", error_type=type(exc).__name__)
        else:
            self._count(sink, "ok")
            bound.info("alert.sent")

    async def _post(self, sink: AlertSink, incident: Incident, status: str) -> None:
        if self._session is None:
            raise DeliveryError("dispatcher not started", retryable=False)
        req = sink.request(incident, status, time.time())
        try:
            async with (
                asyncio.timeout(self._timeout_s),
                self._session.post(
                    req.url.get_secret_value(), data=req.body, headers=req.headers, allow_redirects=False
                ) as resp,
            ):
                await resp.content.read(_MAX_RESPONSE_BYTES)
                code, retry_after = resp.status, _retry_after(resp.headers.get("Retry-After"))
        except TimeoutError:
            raise DeliveryError(f"timeout after {self._timeout_s}s", retryable=True) from None
        except aiohttp.InvalidURL:
            raise DeliveryError("invalid URL", retryable=False) from None
        except (aiohttp.ClientError, OSError) as exc:
            raise DeliveryError(type(exc).__name__, retryable=True) from None
        if not 200 <= code < 300:
            raise DeliveryError(
                f"HTTP {code}", retryable=code in _RETRYABLE_STATUS, retry_after_s=retry_after
            )
