"""The dispatcher that delivers incidents to alert sinks without ever blocking the loop.

`AlertDispatcher.fire(incident)` / `.resolve(incident)` only enqueue (one bounded queue per sink; a full
queue drops and counts). A worker task per sink rate-limits, posts with a per-attempt timeout and retries
network errors, timeouts, 408, 429 and 5xx with exponential backoff and jitter (tenacity); other 4xx are
final. Every outcome is counted in `sglang_supervisor_alert_deliveries_total{sink,outcome}`.

`reconfigure(sinks, ...)` (a reload) swaps the sinks without losing alerts: what is queued for a sink, or being
sent to it, moves to the new sink of the same name (a fixed URL or secret delivers it); a removed sink's worker
gets `RETIRE_S` to deliver its queue.

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
RETIRE_S = 30.0  # a sink removed by a reload delivers what it had queued within this time


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
    sending: tuple[Incident, str] | None = None  # what the worker is delivering (retries included)
    handed_over: bool = False  # its alerts moved to a new lane of the same sink (a reload)


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
        self._metrics = metrics
        self._lanes = self._new_lanes(sinks, queue_size, rate_limit_per_min)
        self._retiring: set[asyncio.Task[None]] = set()
        self._timeout_s = attempt_timeout_s
        self._max_attempts = max_attempts
        self._backoff = wait_exponential_jitter(
            multiplier=backoff_initial_s, max=backoff_max_s, jitter=backoff_initial_s
        )
        self._backoff_max_s = backoff_max_s
        self._session: aiohttp.ClientSession | None = None

    def _new_lanes(self, sinks: Sequence[AlertSink], queue_size: int, rate_per_min: float) -> list[_Lane]:
        if queue_size < 1:
            raise ValueError(f"queue_size must be >= 1, got {queue_size}")
        names = [s.name for s in sinks]
        if len(set(names)) != len(names):
            raise ValueError(f"sink names must be unique, got {names}")
        for name in names:
            if self._metrics is not None:
                self._metrics.declare_sink(name)
        return [
            _Lane(s, asyncio.Queue(maxsize=queue_size), TokenBucket(rate_per_min, time.monotonic))
            for s in sinks
        ]

    @property
    def sink_names(self) -> list[str]:
        """The names of the sinks alerts go to now."""
        return [lane.sink.name for lane in self._lanes]

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
            self._start_worker(lane)

    def _start_worker(self, lane: _Lane) -> None:
        lane.task = asyncio.create_task(self._work(lane), name=f"alerts.{lane.sink.name}")

    def reconfigure(
        self,
        sinks: Sequence[AlertSink],
        *,
        queue_size: int,
        rate_limit_per_min: float,
        attempt_timeout_s: float,
        max_attempts: int,
    ) -> None:
        """Deliver through `sinks` from now on; no alert queued for a sink kept by name is lost (see above)."""
        lanes = self._new_lanes(sinks, queue_size, rate_limit_per_min)
        self._timeout_s, self._max_attempts = attempt_timeout_s, max_attempts
        successors = {lane.sink.name: lane for lane in lanes}
        old, self._lanes = self._lanes, lanes
        for lane in old:
            successor = successors.get(lane.sink.name)
            if successor is not None:
                self._hand_over(lane, successor)
            else:
                self._retire(lane)
        if self._session is not None:
            for lane in lanes:
                self._start_worker(lane)

    def _hand_over(self, lane: _Lane, successor: _Lane) -> None:
        """Move what `lane` is sending and has queued to `successor`, in order; stop its worker."""
        lane.handed_over = True
        pending = [lane.sending] if lane.sending is not None else []
        while not lane.queue.empty():
            pending.append(lane.queue.get_nowait())
            lane.queue.task_done()
        if lane.task is not None:
            lane.task.cancel()
            self._track(lane.task)
            lane.task = None
        for incident, status in pending:
            self._put(successor, incident, status)

    def _retire(self, lane: _Lane) -> None:
        """A removed sink: its worker delivers what is queued within RETIRE_S, then stops."""
        if lane.task is None:
            self._drop_left(lane)
            return
        self._track(asyncio.create_task(self._drain(lane, RETIRE_S), name=f"alerts.{lane.sink.name}.retire"))

    def _track(self, task: asyncio.Task[None]) -> None:
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    async def _drain(self, lane: _Lane, timeout_s: float) -> None:
        try:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout_s):
                    await lane.queue.join()
        finally:
            await self._stop(lane)

    async def _stop(self, lane: _Lane) -> None:
        if lane.task is not None:
            lane.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await lane.task
            lane.task = None
        self._drop_left(lane)

    def _drop_left(self, lane: _Lane) -> None:
        while not lane.queue.empty():
            incident, status = lane.queue.get_nowait()
            lane.queue.task_done()
            self._count(lane.sink, "dropped")
            log.warning("alert.dropped", sink=lane.sink.name, incident=incident.id, status=status)

    async def aclose(self, timeout_s: float = 5.0) -> None:
        """Deliver what is queued within `timeout_s`, then stop; what is left is counted as dropped."""
        if self._session is None:
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                joins = (lane.queue.join() for lane in self._lanes)
                await asyncio.gather(*joins, *self._retiring, return_exceptions=True)
        for task in list(self._retiring):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for lane in self._lanes:
            await self._stop(lane)
        await self._session.close()
        self._session = None

    def _enqueue(self, incident: Incident, status: str) -> None:
        incident = incident.redacted()  # no key in argv, evidence or reason reaches a sink
        for lane in self._lanes:
            self._put(lane, incident, status)

    def _put(self, lane: _Lane, incident: Incident, status: str) -> None:
        try:
            lane.queue.put_nowait((incident, status))
        except asyncio.QueueFull:
            self._count(lane.sink, "dropped")
            log.warning(
                "alert.dropped", sink=lane.sink.name, incident=incident.id, status=status, why="queue full"
            )

    def _count(self, sink: AlertSink, outcome: str) -> None:
        if self._metrics is not None:
            self._metrics.alert_delivery(sink.name, outcome)

    async def _work(self, lane: _Lane) -> None:
        while True:
            lane.sending = incident, status = await lane.queue.get()
            try:
                delay = lane.bucket.reserve()
                if delay > 0:
                    await asyncio.sleep(delay)
                await self._deliver(lane.sink, incident, status)
            except asyncio.CancelledError:
                if not lane.handed_over:
                    self._count(lane.sink, "failed")
                raise
            finally:
                lane.sending = None
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
