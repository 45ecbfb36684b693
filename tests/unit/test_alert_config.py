"""Sinks built from `[alerts]`: an unsigned webhook, secrets named by field path, sinks swapped without loss."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import SecretStr

from supervisor.alerts.dispatcher import AlertDispatcher, WebhookSink, payloads
from supervisor.alerts.from_config import build_sinks
from supervisor.config import AlertsConfig, ConfigError
from supervisor.reporting.metrics import SupervisorMetrics
from tests.support.wait import wait_until
from tests.unit.test_alert_sinks import INCIDENT, Receiver, deliveries

LIMITS = {"queue_size": 16, "rate_limit_per_min": 6000, "attempt_timeout_s": 2.0, "max_attempts": 3}


def test_a_webhook_without_a_secret_is_sent_unsigned(tmp_path: Path) -> None:
    """Regression: the optional HMAC secret was required when the sinks were built; now the body goes unsigned."""
    (tmp_path / "url").write_text("https://hooks.example.com/sup\n")
    sinks = build_sinks(AlertsConfig.model_validate({"webhook": {"url_file": tmp_path / "url"}}))
    assert [s.name for s in sinks] == ["webhook"]
    headers = sinks[0].request(INCIDENT, payloads.FIRING, 1_780_000_000.0).headers
    assert payloads.SIGNATURE_HEADER not in headers and payloads.TIMESTAMP_HEADER not in headers


def test_an_unreadable_secret_is_a_config_error_naming_its_field(tmp_path: Path) -> None:
    """An empty URL file and an unset variable are each named by field path; no secret is in the message."""
    (tmp_path / "url").write_text("\n")
    cfg = AlertsConfig.model_validate(
        {
            "webhook": {"url_file": tmp_path / "url", "hmac_secret_env": "SGLSUP_TEST_UNSET_SECRET"},
            "slack": {"url_env": "SGLSUP_TEST_UNSET_SLACK"},
        }
    )
    with pytest.raises(ConfigError) as caught:
        build_sinks(cfg)
    assert [e.path for e in caught.value.errors] == [
        "alerts.webhook.url_file",
        "alerts.webhook.hmac_secret_env",
        "alerts.slack.url_env",
    ]


async def test_a_sink_removed_by_a_reload_still_delivers_what_it_had_queued() -> None:
    """Alerts queued for a sink the new config drops are delivered by its old worker before it stops."""
    receiver = Receiver()
    await receiver.start()
    metrics = SupervisorMetrics()
    d = AlertDispatcher([WebhookSink(SecretStr(receiver.url("/old")))], metrics=metrics, **LIMITS)
    try:
        await d.start()
        receiver.slow = True
        d.fire(INCIDENT)
        d.fire(INCIDENT)
        await wait_until(lambda: len(receiver.requests) == 1, 10, "the first alert in flight")
        d.reconfigure([], **LIMITS)
        assert d.sink_names == []
        receiver.release.set()
        await wait_until(lambda: deliveries(metrics, "webhook", "ok") == 2, 10, "both alerts delivered")
    finally:
        await d.aclose(1.0)
        await receiver.stop()
