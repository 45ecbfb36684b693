"""The daemon's configuration: TOML → frozen pydantic models, validated once at load (docs/config.md).

`models` holds the typed tables, `loading` reads the file and the `SGLSUP_*` overrides, `checks` the rules
that span fields, `errors` what a problem looks like. Import the names from here.
"""

from supervisor.config.checks import check_config
from supervisor.config.errors import ConfigError, FieldError
from supervisor.config.loading import ENV_PREFIX, apply_env_overrides, load_config, parse_config
from supervisor.config.models import (
    SGLANG_DEFAULT_PORT,
    SGLANG_HEALTH_TIMEOUT_S,
    AlertmanagerSinkConfig,
    AlertsConfig,
    Config,
    HttpConfig,
    PagerDutySinkConfig,
    PolicyConfig,
    ProbesConfig,
    RestartConfig,
    ServerConfig,
    SlackSinkConfig,
    SupervisorConfig,
    WebhookSinkConfig,
)

__all__ = [
    "ENV_PREFIX",
    "SGLANG_DEFAULT_PORT",
    "SGLANG_HEALTH_TIMEOUT_S",
    "AlertmanagerSinkConfig",
    "AlertsConfig",
    "Config",
    "ConfigError",
    "FieldError",
    "HttpConfig",
    "PagerDutySinkConfig",
    "PolicyConfig",
    "ProbesConfig",
    "RestartConfig",
    "ServerConfig",
    "SlackSinkConfig",
    "SupervisorConfig",
    "WebhookSinkConfig",
    "apply_env_overrides",
    "check_config",
    "load_config",
    "parse_config",
]
