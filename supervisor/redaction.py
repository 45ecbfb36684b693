"""The secrets this daemon knows (server API keys, env secrets, its own tokens), and hiding them everywhere.

Every secret value is registered once (`register`, `register_config`); `hide(value)` masks them in any
JSON-ready value. The structlog processor `scrub_event` applies it to every log event, `/status` and
`/incidents` bodies, incidents, alert payloads and forensics bundles go through it too, so a key reaches
none of them even when it hides in a log line the server printed.
"""

from __future__ import annotations

import stat
import threading
from collections.abc import Mapping, MutableMapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from policies import argv
from policies.secrets import argv_secrets, env_secrets, redact_env, scrub

if TYPE_CHECKING:
    from supervisor.config import Config, ServerConfig

API_KEY_ENV = "SGLANG_API_KEY"  # read by wrapper commands that pass the key on to SGLang themselves
_MAX_KEY_BYTES = 4096
_known: set[str] = set()
_lock = threading.Lock()


def register(*secrets: str | None) -> None:
    """Remember secret values so that `hide` masks them from now on."""
    with _lock:
        _known.update(s for s in secrets if s)


def hide(value: Any) -> Any:
    """`value` with every registered secret masked (`***`)."""
    with _lock:
        known = list(_known)
    return scrub(value, known)


def scrub_event(_logger: Any, _method: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """structlog processor: no registered secret leaves in a log line."""
    masked = hide(dict(event))
    assert isinstance(masked, dict)
    return masked


def read_key_file(path: Path) -> str | None:
    """The first line of a key file, stripped (None when empty); OSError when unreadable."""
    with path.open("rb") as fh:
        text = fh.read(_MAX_KEY_BYTES).decode("utf-8", "replace")
    lines = text.strip().splitlines()
    return lines[0].strip() if lines else None


def server_api_key(cfg: ServerConfig) -> str | None:
    """The key the server requires on its non-health endpoints: `--api-key` in its args (either form), else
    `api_key_file`, else `SGLANG_API_KEY` in its env. None when it requires none (an `--admin-api-key` alone
    protects only admin endpoints, which the probes never call)."""
    key = argv.value(cfg.args, "--api-key")
    if key:
        return key
    if cfg.api_key_file is not None:
        try:
            return read_key_file(Path(cfg.api_key_file))
        except OSError:
            return None
    return cfg.env.get(API_KEY_ENV) or None


def server_secrets(cfg: ServerConfig) -> list[str]:
    """Every secret of one server: its keys (argv, key file, env) and its secret-looking env values."""
    found = [*argv_secrets(cfg.args), *env_secrets(cfg.env)]
    key = server_api_key(cfg)
    return [*found, key] if key else found


def register_config(config: Config) -> None:
    """Register every server's secrets and the control token."""
    for server in config.servers:
        register(*server_secrets(server))
    token = config.supervisor.http.token_file
    if token is not None:
        try:
            register(read_key_file(Path(token)))
        except OSError:
            return


def loose_permissions(path: Path) -> str | None:
    """A warning when a secret file can be read by its group or by everyone; None when it is private."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return None
    if not mode & (stat.S_IRGRP | stat.S_IROTH):
        return None
    who = "everyone" if mode & stat.S_IROTH else "its group"
    return f"{path} is readable by {who} (mode {stat.S_IMODE(mode):04o}); chmod 600 it"


def secret_file_warnings(config: Config) -> list[str]:
    """A warning per secret file (control token, API key files, alert secrets) its group or everyone can read."""
    alerts = config.alerts
    files = [
        config.supervisor.http.token_file,
        *(s.api_key_file for s in config.servers),
        alerts.webhook and alerts.webhook.url_file,
        alerts.webhook and alerts.webhook.hmac_secret_file,
        alerts.slack and alerts.slack.url_file,
        alerts.pagerduty and alerts.pagerduty.routing_key_file,
    ]
    warnings = (loose_permissions(Path(f)) for f in files if f)
    return [w for w in warnings if w]


def env_for_display(env: Mapping[str, str]) -> dict[str, str]:
    """An environment as it may be shown: secret-looking values and registered secrets masked."""
    shown = hide(redact_env(env))
    assert isinstance(shown, dict)
    return shown
