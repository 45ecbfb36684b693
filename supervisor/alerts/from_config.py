"""Build the alert sinks and dispatcher from the `[alerts]` config; secrets only ever as `SecretStr`.

`build_sinks` reads every secret the way delivery will use it and raises `ConfigError` naming the field
(`alerts.webhook.url_file: ...`), never the secret; `supervisor.config.prepare` calls it for `check-config`,
`run` and every reload alike.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

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
from supervisor.config import AlertsConfig, ConfigError, FieldError
from supervisor.reporting.metrics import SupervisorMetrics


class _Secrets:
    """Reads the secrets of the sinks, collecting one `FieldError` per secret that cannot be read."""

    def __init__(self) -> None:
        self.errors: list[FieldError] = []

    def read(self, path: str, file: Path | None, env: str, required: bool = True) -> SecretStr | None:
        """The secret of `<path>_file` or `<path>_env`; None (with an error when `required`) when neither is set."""
        try:
            if file is not None:
                return secret_from_file(file)
            if env:
                return secret_from_env(env)
        except OSError as exc:
            self.errors.append(
                FieldError(f"{path}_file", str(file), f"a file this user can read ({exc.strerror})")
            )
            return None
        except ValueError as exc:
            where, value = (f"{path}_file", str(file)) if file is not None else (f"{path}_env", env)
            self.errors.append(FieldError(where, value, f"a non-empty secret ({exc})"))
            return None
        if required:
            self.errors.append(FieldError(f"{path}_file", None, f"{path}_file or {path}_env"))
        return None


def build_sinks(cfg: AlertsConfig) -> list[AlertSink]:
    """Every configured sink; ConfigError naming each secret that is missing or unreadable."""
    secrets = _Secrets()
    runbook_base = cfg.runbook_url
    sinks: list[AlertSink] = []
    if cfg.webhook is not None:
        hook = cfg.webhook
        url = secrets.read("alerts.webhook.url", hook.url_file, hook.url_env)
        key = secrets.read("alerts.webhook.hmac_secret", hook.hmac_secret_file, hook.hmac_secret_env, False)
        if url is not None:
            sinks.append(WebhookSink(url, key, runbook_base=runbook_base))
    if cfg.slack is not None:
        url = secrets.read("alerts.slack.url", cfg.slack.url_file, cfg.slack.url_env)
        if url is not None:
            sinks.append(SlackSink(url, runbook_base=runbook_base))
    if cfg.pagerduty is not None:
        pd = cfg.pagerduty
        routing = secrets.read("alerts.pagerduty.routing_key", pd.routing_key_file, pd.routing_key_env)
        if routing is not None:
            sinks.append(PagerDutySink(routing, runbook_base=runbook_base))
    if cfg.alertmanager is not None:
        sinks.append(AlertmanagerSink(cfg.alertmanager.url, runbook_base=runbook_base))
    if secrets.errors:
        raise ConfigError(secrets.errors)
    return sinks


def delivery_limits(cfg: AlertsConfig) -> dict[str, Any]:
    """The dispatcher's queue, rate, timeout and attempts from `[alerts]`."""
    return {
        "queue_size": cfg.queue_size,
        "rate_limit_per_min": cfg.rate_limit_per_min,
        "attempt_timeout_s": cfg.timeout_s,
        "max_attempts": cfg.retries + 1,
    }


def build_dispatcher(
    cfg: AlertsConfig, sinks: list[AlertSink], metrics: SupervisorMetrics
) -> AlertDispatcher:
    """The dispatcher of `sinks` (none is fine: a reload may add some later)."""
    return AlertDispatcher(sinks, metrics=metrics, **delivery_limits(cfg))
