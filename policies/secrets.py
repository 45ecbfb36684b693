"""Secrets in argv, environments and free text: find them, hide them (pure; no I/O).

SGLang takes `--api-key` (required as `Authorization: Bearer` on every endpoint but `/health*`, `/ready*` and
`/metrics`) and `--admin-api-key` (admin endpoints only). Neither may appear in anything the supervisor shows:
`/status`, logs, incidents, alerts, forensics. Argv positions are masked by `policies.argv.redact`; this module
finds the secret values and masks them wherever else they turn up (a server's log line, an evidence string).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from policies import argv

MASK = argv.REDACTED
SECRET_ENV = re.compile(r"TOKEN|SECRET|PASSWORD|PASSWD|API_KEY|APIKEY|CREDENTIAL|PRIVATE|AUTH", re.IGNORECASE)
MIN_SECRET_LEN = (
    8  # shorter values ("true", "1") would mask ordinary words; flags are masked by position anyway
)


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    """Values of secret-looking variables (`*TOKEN*`, `*API_KEY*`, ...) replaced by `***`."""
    return {k: (MASK if SECRET_ENV.search(k) else v) for k, v in env.items()}


def argv_secrets(args: Sequence[str]) -> list[str]:
    """Every secret value the argv carries (`--api-key`, `--admin-api-key`, `--ssl-keyfile-password`)."""
    return [v for v in (argv.value(args, f) for f in argv.SECRET_FLAGS) if v]


def env_secrets(env: Mapping[str, str]) -> list[str]:
    """Values of secret-looking variables."""
    return [v for k, v in env.items() if SECRET_ENV.search(k) and v]


def scrub(value: Any, secrets: Iterable[str]) -> Any:
    """`value` with every occurrence of each secret replaced by `***`, through dicts, lists and tuples."""
    known = sorted({s for s in secrets if len(s) >= MIN_SECRET_LEN}, key=len, reverse=True)
    if not known:
        return value
    pattern = re.compile("|".join(re.escape(s) for s in known))
    return _scrub(value, pattern)


def _scrub(value: Any, pattern: re.Pattern[str]) -> Any:
    if isinstance(value, str):
        return pattern.sub(MASK, value)
    if isinstance(value, Mapping):
        return {_scrub(k, pattern): _scrub(v, pattern) for k, v in value.items()}
    if isinstance(value, list | tuple):
        items = [_scrub(v, pattern) for v in value]
        return tuple(items) if isinstance(value, tuple) else items
    return value
