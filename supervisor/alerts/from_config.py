"""Build the alert sinks and dispatcher from the `[alerts]` config; secrets only ever as `SecretStr`."""

from __future__ import annotations

from pydantic import SecretStr

from supervisor.alerts.dispatcher import (
    AlertDispatcher,
    AlertmanagerSink,
    AlertSink,
    PagerDutySink,
    SlackSink,
    WebhookSink,
    secret_from_env,
    secret_from_file,
)
from supervisor.config import AlertsConfig
from supervisor.reporting.metrics import SupervisorMetrics

RUNBOOK_BASE = "runbook.md"  # alerts link to runbook.md#<fault-kind>


def _secret(file: object, env: str, what: str) -> SecretStr:
    if file:
        return secret_from_file(str(file))
    if env:
        return secret_from_env(env)
    raise ValueError(f"{what}: set a *_file or *_env")


def build_sinks(cfg: AlertsConfig, runbook_base: str = RUNBOOK_BASE) -> list[AlertSink]:
    """Every configured sink; a missing secret raises ValueError naming the sink (never the secret)."""
    sinks: list[AlertSink] = []
    if cfg.webhook is not None:
        url = _secret(cfg.webhook.url_file, cfg.webhook.url_env, "alerts.webhook url")
        key = _secret(cfg.webhook.hmac_secret_file, cfg.webhook.hmac_secret_env, "alerts.webhook hmac secret")
        sinks.append(WebhookSink(url, key, runbook_base=runbook_base))
    if cfg.slack is not None:
        sinks.append(
            SlackSink(
                _secret(cfg.slack.url_file, cfg.slack.url_env, "alerts.slack url"), runbook_base=runbook_base
            )
        )
    if cfg.pagerduty is not None:
        key = _secret(
            cfg.pagerduty.routing_key_file, cfg.pagerduty.routing_key_env, "alerts.pagerduty routing key"
        )
        sinks.append(PagerDutySink(key, runbook_base=runbook_base))
    if cfg.alertmanager is not None:
        sinks.append(AlertmanagerSink(cfg.alertmanager.url, runbook_base=runbook_base))
    return sinks


def build_dispatcher(cfg: AlertsConfig, metrics: SupervisorMetrics) -> AlertDispatcher | None:
    """The dispatcher, or None when no sink is configured."""
    sinks = build_sinks(cfg)
    if not sinks:
        return None
    return AlertDispatcher(
        sinks,
        queue_size=cfg.queue_size,
        rate_limit_per_min=cfg.rate_limit_per_min,
        metrics=metrics,
        attempt_timeout_s=cfg.timeout_s,
        max_attempts=cfg.retries + 1,
    )
