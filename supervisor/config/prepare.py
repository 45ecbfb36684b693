"""What `run` builds from a loaded config, built once and checked: `check-config`, `run` and reload all call `prepare`.

`load_config` validates the file; some configs it accepts still cannot start: a secret file that is empty, a
control token the daemon cannot read, a bind address that is not this host's, an etcd CA file that is no
certificate, a state directory that is a file, a server command that cannot run or is a container client (the
supervisor would own the client, not the container). `prepare` builds each of these parts the way the daemon uses
them and raises `ConfigError` naming the field, so a config `check-config` accepts starts, and both commands
refuse the others with exit 78 (EX_CONFIG), which systemd does not restart.
"""

from __future__ import annotations

import dataclasses
import os
import socket
from dataclasses import dataclass
from pathlib import Path

from supervisor.alerts.from_config import build_sinks
from supervisor.alerts.payloads import AlertSink
from supervisor.config.errors import ConfigError, FieldError
from supervisor.config.group import GroupConfig
from supervisor.config.models import Config, HttpConfig
from supervisor.group.etcd import EtcdSettings, ssl_context
from supervisor.host.preflight import command_problem, container_problem
from supervisor.reporting.status_http import load_token


@dataclass(frozen=True)
class Prepared:
    """The built parts of a config: its alert sinks and its etcd client settings (None without `[group]`)."""

    config: Config
    sinks: tuple[AlertSink, ...]
    etcd: EtcdSettings | None


def prepare(config: Config) -> Prepared:
    """Build what `run` builds from `config`; ConfigError listing every part that cannot be built."""
    errors = [*_command_errors(config), *_dir_errors(config), *_http_errors(config.supervisor.http)]
    sinks: list[AlertSink] = []
    try:
        sinks = build_sinks(config.alerts)
    except ConfigError as exc:
        errors += exc.errors
    etcd, etcd_errors = _etcd(config.group)
    errors += etcd_errors
    if errors:
        raise ConfigError(errors)
    return Prepared(config, tuple(sinks), etcd)


def _command_errors(config: Config) -> list[FieldError]:
    errors: list[FieldError] = []
    for i, server in enumerate(config.servers):
        program = server.command[0] if server.command else None
        where = f"servers[{i}].command ({server.name})"
        client = container_problem(server.command)
        if client:
            errors.append(FieldError(where, program, client))
            continue
        why = command_problem(server.command, server.env)
        if why:
            errors.append(FieldError(where, program, f"a program that runs: {why}"))
    return errors


def _dir_errors(config: Config) -> list[FieldError]:
    """`state_dir` and `log_dir`: directories this user can write, or that it can create."""
    errors: list[FieldError] = []
    for key in ("state_dir", "log_dir"):
        path = Path(getattr(config.supervisor, key))
        existing = path
        while not existing.exists() and existing != existing.parent:
            existing = existing.parent
        if not existing.is_dir():
            why = f"{existing} is not a directory"
        elif not os.access(existing, os.W_OK | os.X_OK):
            why = f"{existing} is not writable by this user"
        else:
            continue
        errors.append(
            FieldError(f"supervisor.{key}", str(path), f"a directory the daemon can create or write ({why})")
        )
    return errors


def _http_errors(http: HttpConfig) -> list[FieldError]:
    """The control token is readable and not empty; the bind address is one of this host's."""
    errors: list[FieldError] = []
    if http.token_file is not None:
        try:
            load_token(http.token_file)
        except OSError as exc:
            allowed = f"a file this user can read ({exc.strerror})"
            errors.append(FieldError("supervisor.http.token_file", str(http.token_file), allowed))
        except ValueError as exc:
            errors.append(FieldError("supervisor.http.token_file", str(http.token_file), str(exc)))
    why = bind_problem(http.host)
    if why:
        errors.append(FieldError("supervisor.http.host", http.host, f"an address of this host ({why})"))
    return errors


def bind_problem(host: str) -> str | None:
    """Why the status server could not bind `host` (tried on port 0: a running daemon's port is no obstacle)."""
    try:
        infos = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        return f"cannot resolve it: {exc.strerror}"
    for family, kind, proto, _, address in infos:
        try:
            sock = socket.socket(family, kind, proto)
        except OSError:
            continue  # an address family this host lacks, skipped as the server's own bind skips it
        with sock:
            try:
                sock.bind(address)
            except OSError as exc:
                return f"cannot bind {address[0]}: {exc.strerror}"
    return None


def _etcd(group: GroupConfig | None) -> tuple[EtcdSettings | None, list[FieldError]]:
    """The etcd client settings (password read) and its TLS context, built as the client builds them."""
    if group is None:
        return None, []
    etcd = group.etcd
    try:
        settings = etcd.settings()
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        return None, [
            FieldError("group.etcd.password_file", str(etcd.password_file), f"a readable file ({why})")
        ]
    steps = (
        ("group.etcd.ca_file", etcd.ca_file, dataclasses.replace(settings, cert_file=None, key_file=None)),
        ("group.etcd.cert_file", etcd.cert_file, settings),
    )
    for field, path, partial in steps:
        try:
            ssl_context(partial)
        except (OSError, ValueError) as exc:
            return None, [FieldError(field, str(path), f"a PEM file the TLS client loads ({exc})")]
    return settings, []
