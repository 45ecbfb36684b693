"""Alert sinks and dispatcher against real local HTTP receivers: signatures, shapes, retries, never blocking."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from pydantic import SecretStr
from structlog.testing import capture_logs

from supervisor import packaged
from supervisor.alerts.dispatcher import (
    AlertDispatcher,
    AlertmanagerSink,
    PagerDutySink,
    SlackSink,
    TokenBucket,
    WebhookSink,
    payloads,
    secret_from_env,
    secret_from_file,
)
from supervisor.records.incident import Incident
from supervisor.reporting.metrics import SupervisorMetrics
from tests.support.ports import free_port
from tests.support.wait import wait_until

HMAC_KEY = "hmac-key-do-not-log-7f3a"
SLACK_TOKEN = "T000/B000/slacktoken-do-not-log-91c2"
ROUTING_KEY = "routing-key-do-not-log-0123456789ab"
INCIDENT = Incident(
    id="inc-20261129-0001",
    server="decode",
    fault="decode_wedge",
    detected_at=1_780_000_000.0,
    evidence={"progress_stalled_s": 42.0},
    action="restart",
    reason="no decode progress for 42 s with 3 requests running",
    rung=1,
    flags_added=("--disable-cuda-graph",),
)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Receiver:
    """A local aiohttp server that records each request's path, headers and raw body."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, dict[str, str], bytes]] = []
        self.statuses: list[int] = []
        self.release = asyncio.Event()
        self.slow = False
        self.port = 0
        self._runner: web.AppRunner | None = None

    async def handle(self, request: web.Request) -> web.Response:
        """Record the request, then answer the next scripted status (default 200)."""
        self.requests.append((request.path, dict(request.headers), await request.read()))
        if self.slow:
            await asyncio.wait_for(self.release.wait(), timeout=30)
        return web.Response(status=self.statuses.pop(0) if self.statuses else 200, text="ok")

    async def start(self) -> None:
        """Listen on a free port of 127.0.0.1."""
        app = web.Application()
        app.router.add_post("/{tail:.*}", self.handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = self._runner.addresses[0][1]

    async def stop(self) -> None:
        """Release slow handlers and shut the server down."""
        self.release.set()
        if self._runner is not None:
            await self._runner.cleanup()

    def url(self, path: str) -> str:
        """The receiver's URL for `path`."""
        return f"http://127.0.0.1:{self.port}{path}"

    def json(self, index: int) -> Any:
        """The JSON body of request number `index`."""
        return json.loads(self.requests[index][2])


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    """A running Receiver, stopped at the end."""
    r = Receiver()
    await r.start()
    try:
        yield r
    finally:
        await r.stop()


def deliveries(metrics: SupervisorMetrics, sink: str, outcome: str) -> float:
    """The alert_deliveries_total sample of one sink and outcome."""
    value = metrics.registry.get_sample_value(
        "sglang_supervisor_alert_deliveries_total", {"sink": sink, "outcome": outcome}
    )
    return value or 0.0


def dispatcher(sinks: list[Any], metrics: SupervisorMetrics, **kwargs: Any) -> AlertDispatcher:
    """A dispatcher with fast retries for tests."""
    options: dict[str, Any] = {
        "attempt_timeout_s": 2.0,
        "max_attempts": 3,
        "backoff_initial_s": 0.01,
        "backoff_max_s": 0.05,
    }
    options.update(kwargs)
    return AlertDispatcher(sinks, queue_size=16, rate_limit_per_min=6000, metrics=metrics, **options)


async def test_webhook_receiver_verifies_hmac_of_every_payload(receiver: Receiver) -> None:
    """Firing and resolved webhook bodies both carry a valid HMAC over timestamp + '.' + body."""
    metrics = SupervisorMetrics()
    d = dispatcher([WebhookSink(SecretStr(receiver.url("/hook")), SecretStr(HMAC_KEY))], metrics)
    await d.start()
    d.fire(INCIDENT)
    d.resolve(INCIDENT.resolve(recovered_at=INCIDENT.detected_at + 60, time_to_serving_s=55.0))
    await wait_until(lambda: deliveries(metrics, "webhook", "ok") == 2, 10, "2 webhook ok deliveries")
    await d.aclose()
    assert [receiver.json(i)["status"] for i in range(2)] == ["firing", "resolved"]
    for _, headers, body in receiver.requests:
        assert payloads.verify_signature(
            HMAC_KEY.encode(),
            headers[payloads.TIMESTAMP_HEADER],
            body,
            headers[payloads.SIGNATURE_HEADER],
            now=time.time(),
            max_skew_s=300,
        )
    assert receiver.json(0)["incident"]["id"] == INCIDENT.id
    assert receiver.json(0)["runbook_url"] == f"{packaged.runbook_url()}#decode_wedge"


def test_verify_signature_rejects_tampering_wrong_key_and_stale_timestamps() -> None:
    """Only the exact bytes, the right key and a fresh integer timestamp verify."""
    key, body, ts = b"k", b'{"a":1}', "1780000000"
    header = payloads.sign(key, ts, body)
    assert payloads.verify_signature(key, ts, body, header, now=1_780_000_100.0, max_skew_s=300)
    assert not payloads.verify_signature(key, ts, body + b" ", header, now=1_780_000_100.0)
    assert not payloads.verify_signature(b"other", ts, body, header, now=1_780_000_100.0)
    assert not payloads.verify_signature(key, ts, body, header, now=1_780_000_301.0, max_skew_s=300)
    assert not payloads.verify_signature(key, "soon", body, header, now=1_780_000_100.0)
    assert not payloads.verify_signature(key, ts, body, header.upper(), now=1_780_000_100.0)


async def test_slack_pagerduty_alertmanager_payload_shapes(receiver: Receiver) -> None:
    """Each sink posts its service's documented shape, for firing and resolved."""
    metrics = SupervisorMetrics()
    sinks = [
        SlackSink(SecretStr(receiver.url("/slack/" + SLACK_TOKEN)), source="gpu-a1"),
        PagerDutySink(SecretStr(ROUTING_KEY), url=receiver.url("/v2/enqueue"), source="gpu-a1"),
        AlertmanagerSink(receiver.url("/am"), source="gpu-a1", runbook_base="https://ops.example/runbook.md"),
    ]
    d = dispatcher(sinks, metrics)
    await d.start()
    d.fire(INCIDENT)
    await wait_until(lambda: len(receiver.requests) >= 3, 10, "3 requests received")
    d.resolve(INCIDENT.resolve(recovered_at=INCIDENT.detected_at + 60, time_to_serving_s=55.0))
    await wait_until(lambda: len(receiver.requests) >= 6, 10, "6 requests received")
    await d.aclose()
    by_path: dict[str, list[Any]] = {}
    for path, _, body in receiver.requests:  # a post answered late is retried: its first and last count
        by_path.setdefault(path.split("/")[1], []).append(json.loads(body))

    slack_fire, slack_resolve = by_path["slack"][0], by_path["slack"][-1]
    assert "decode_wedge" in slack_fire["text"] and slack_fire["blocks"][0]["type"] == "section"
    assert slack_resolve["text"].startswith(":white_check_mark: RESOLVED")

    trigger, resolve = by_path["v2"][0], by_path["v2"][-1]
    assert trigger["event_action"] == "trigger" and trigger["dedup_key"] == INCIDENT.id
    assert trigger["routing_key"] == ROUTING_KEY and trigger["payload"]["severity"] == "critical"
    assert trigger["payload"]["source"] == "gpu-a1" and trigger["payload"]["class"] == "decode_wedge"
    assert resolve == {"routing_key": ROUTING_KEY, "event_action": "resolve", "dedup_key": INCIDENT.id}

    (am_fire,), (am_resolve,) = by_path["am"][0], by_path["am"][-1]
    assert {p for p, _, _ in receiver.requests if p.startswith("/am")} == {"/am/api/v2/alerts"}
    assert am_fire["labels"] == {
        "alertname": "SglangSupervisorIncident",
        "server": "decode",
        "fault": "decode_wedge",
        "severity": "critical",
        "incident": INCIDENT.id,
        "instance": "gpu-a1",
    }
    assert am_fire["annotations"]["runbook_url"] == "https://ops.example/runbook.md#decode_wedge"
    assert set(am_fire["annotations"]) == {"summary", "description", "runbook_url"}
    assert am_fire["startsAt"] == "2026-05-28T20:26:40.000Z"
    assert am_fire["endsAt"] > am_fire["startsAt"]
    assert am_resolve["labels"] == am_fire["labels"]
    assert am_resolve["endsAt"] == "2026-05-28T20:27:40.000Z"
    assert deliveries(metrics, "alertmanager", "ok") == 2


async def test_5xx_is_retried_and_4xx_is_final(receiver: Receiver) -> None:
    """A 503 is retried until it succeeds; a 400 fails at once without a retry."""
    metrics = SupervisorMetrics()
    receiver.statuses = [503, 503, 200, 400]
    d = dispatcher([SlackSink(SecretStr(receiver.url("/s")))], metrics)
    await d.start()
    d.fire(INCIDENT)
    await wait_until(lambda: deliveries(metrics, "slack", "ok") == 1, 10, "1 slack ok deliveries")
    assert len(receiver.requests) == 3
    d.resolve(INCIDENT)
    await wait_until(lambda: deliveries(metrics, "slack", "failed") == 1, 10, "1 slack failed deliveries")
    await d.aclose()
    assert len(receiver.requests) == 4


def refused_url() -> str:
    """A 127.0.0.1 URL whose port has no listener."""
    return f"http://127.0.0.1:{free_port()}/hook/{SLACK_TOKEN}"


async def test_dead_receiver_never_blocks_fire_and_counts_failure() -> None:
    """fire() returns before any attempt is made; connection refused ends as a counted failure."""
    metrics = SupervisorMetrics()
    d = dispatcher([SlackSink(SecretStr(refused_url()))], metrics)
    await d.start()
    d.fire(INCIDENT)
    assert deliveries(metrics, "slack", "failed") == 0 and deliveries(metrics, "slack", "ok") == 0
    await wait_until(lambda: deliveries(metrics, "slack", "failed") == 1, 10, "1 slack failed deliveries")
    await d.aclose()


async def test_slow_receiver_times_out_without_blocking_other_sinks(receiver: Receiver) -> None:
    """A receiver slower than the attempt timeout fails and counts, while another sink still delivers."""
    metrics = SupervisorMetrics()
    receiver.slow = True
    fast = Receiver()
    await fast.start()
    try:
        d = dispatcher(
            [
                SlackSink(SecretStr(receiver.url("/slow"))),
                WebhookSink(SecretStr(fast.url("/fast")), SecretStr("k")),
            ],
            metrics,
            attempt_timeout_s=1.0,  # the receiver holds every request 30 s; each try must reach it under load
            max_attempts=2,
        )
        await d.start()
        d.fire(INCIDENT)
        assert deliveries(metrics, "slack", "failed") == 0
        await wait_until(lambda: deliveries(metrics, "webhook", "ok") == 1, 10, "1 webhook ok deliveries")
        await wait_until(lambda: deliveries(metrics, "slack", "failed") == 1, 10, "1 slack failed deliveries")
        await d.aclose()
        assert len(receiver.requests) == 2
    finally:
        await fast.stop()


def test_full_queue_drops_and_counts() -> None:
    """Beyond queue_size, fire() drops the alert and counts it as dropped."""
    metrics = SupervisorMetrics()
    d = AlertDispatcher([SlackSink(SecretStr("http://127.0.0.1:9/x"))], queue_size=1, metrics=metrics)
    for _ in range(3):
        d.fire(INCIDENT)
    assert deliveries(metrics, "slack", "dropped") == 2


async def test_aclose_delivers_what_is_queued(receiver: Receiver) -> None:
    """aclose() waits for queued alerts to go out before stopping the workers."""
    metrics = SupervisorMetrics()
    d = dispatcher([SlackSink(SecretStr(receiver.url("/s")))], metrics)
    await d.start()
    d.fire(INCIDENT)
    d.resolve(INCIDENT)
    await d.aclose(timeout_s=10)
    assert deliveries(metrics, "slack", "ok") == 2


def test_token_bucket_allows_burst_then_spaces_deliveries() -> None:
    """60/min allows a burst of 10, then one delivery a second."""
    now = [100.0]
    bucket = TokenBucket(60, lambda: now[0])
    assert [bucket.reserve() for _ in range(10)] == [0.0] * 10
    assert bucket.reserve() == pytest.approx(1.0)
    now[0] += 5.0
    assert bucket.reserve() == 0.0


def test_secret_never_shows_in_repr_or_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Secrets load from files and env vars; reprs and load errors never show the value."""
    path = tmp_path / "key"
    path.write_text(HMAC_KEY + "\n")
    secret = secret_from_file(path)
    assert secret.get_secret_value() == HMAC_KEY
    assert HMAC_KEY not in repr(secret) and HMAC_KEY not in str(secret)
    monkeypatch.setenv("SGLSUP_TEST_SLACK_URL", SLACK_TOKEN)
    assert secret_from_env("SGLSUP_TEST_SLACK_URL").get_secret_value() == SLACK_TOKEN
    sinks = [
        WebhookSink(SecretStr(refused_url()), secret),
        SlackSink(secret_from_env("SGLSUP_TEST_SLACK_URL")),
        PagerDutySink(SecretStr(ROUTING_KEY)),
    ]
    for sink in sinks:
        assert HMAC_KEY not in repr(sink) and SLACK_TOKEN not in repr(sink) and ROUTING_KEY not in repr(sink)
    monkeypatch.delenv("SGLSUP_TEST_SLACK_URL")
    with pytest.raises(ValueError, match="SGLSUP_TEST_SLACK_URL") as missing:
        secret_from_env("SGLSUP_TEST_SLACK_URL")
    assert SLACK_TOKEN not in str(missing.value)


async def test_nothing_secret_in_logs(receiver: Receiver, caplog: pytest.LogCaptureFixture) -> None:
    """Deliveries that succeed, fail, retry and time out log sink names, never URLs or keys."""
    metrics = SupervisorMetrics()
    receiver.statuses = [500, 401]
    caplog.set_level(logging.DEBUG)
    with capture_logs() as logs:
        d = dispatcher(
            [
                SlackSink(SecretStr(receiver.url("/slack/" + SLACK_TOKEN))),
                SlackSink(SecretStr(refused_url()), name="slack-dead"),
                PagerDutySink(SecretStr(ROUTING_KEY), url=receiver.url("/v2/enqueue")),
                WebhookSink(SecretStr(receiver.url("/hook/" + SLACK_TOKEN)), SecretStr(HMAC_KEY)),
            ],
            metrics,
        )
        await d.start()
        d.fire(INCIDENT)
        await wait_until(
            lambda: (
                sum(
                    deliveries(metrics, s, o)
                    for s in ("slack", "slack-dead", "pagerduty", "webhook")
                    for o in ("ok", "failed")
                )
                == 4
            ),
            10,
            "four deliveries settled",
        )
        await d.aclose()
    events = {entry["event"] for entry in logs}
    assert {"alert.sent", "alert.retrying", "alert.delivery_failed"} <= events
    text = repr(logs) + caplog.text
    for secret in (HMAC_KEY, SLACK_TOKEN, ROUTING_KEY, "slacktoken"):
        assert secret not in text
