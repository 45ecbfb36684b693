"""The imported deployment as a commented TOML config, and the summary of what was inferred and what to check.

Strings are written so that they read as the argument SGLang gets: a literal string (`'…'`) when the text
holds a quote or a backslash and no `'` (a JSON argument stays legible), a basic string (`"…"`, escaped as
JSON escapes, which TOML shares) otherwise.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

from policies import argv
from policies.pd import Role
from policies.secrets import SECRET_ENV
from supervisor.importing import suggest
from supervisor.importing.incontainer import Container
from supervisor.importing.infer import ServerPlan, env_summary

# StateDirectory= and LogsDirectory= of systemd/sglang-supervisor.service; the same paths in the image.
STATE_DIR = "/var/lib/sglang-supervisor"
LOG_DIR = "/var/log/sglang-supervisor"
_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def toml_str(text: str) -> str:
    """`text` as a TOML string."""
    plain = all(c == "\t" or (c >= " " and c != "\x7f") for c in text)
    if plain and "'" not in text and ('"' in text or "\\" in text):
        return f"'{text}'"
    return json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007f")


def _key(name: str) -> str:
    return name if _BARE_KEY.match(name) else toml_str(name)


def _list(items: Sequence[str]) -> str:
    return "[" + ", ".join(toml_str(i) for i in items) + "]"


def _line(text: str, comment: str | None, width: int = 0) -> str:
    return f"{text:<{width}}  # {comment}" if comment else text


def _args(plan: ServerPlan) -> list[str]:
    """`args = [ … ]`, one option with its values a line, the import's changes commented."""
    table = argv.EXACT if plan.role is Role.ROUTER else argv.SGLANG
    found = argv.scan(plan.args, table)
    groups: list[tuple[tuple[str, ...], str | None]] = []
    first = found[0].start if found else len(plan.args)
    if first:
        groups.append((tuple(plan.args[:first]), None))
    for occurrence in found:
        note = plan.arg_notes.get(occurrence.key) or plan.arg_notes.get(occurrence.option)
        groups.append((occurrence.tokens, note))
    rows = [", ".join(toml_str(t) for t in tokens) + "," for tokens, _ in groups]
    width = max((len(r) for r, (_, note) in zip(rows, groups, strict=True) if note), default=0)
    lines = ["args = ["]
    lines += ["  " + _line(row, note, width) for row, (_, note) in zip(rows, groups, strict=True)]
    lines += [f"  # dropped by import: {why}" for why in plan.removed]
    return [*lines, "]"]


def _server(plan: ServerPlan) -> list[str]:
    out = ["[[servers]]", f"name = {toml_str(plan.name)}", f"role = {toml_str(plan.role.value)}"]
    out.append(
        f"# ExecStart= of {plan.source}" if plan.source.endswith(".service") else f"# from {plan.source}"
    )
    if plan.container is not None:
        out.append(f"# the command inside {plan.container.run.label}: the supervisor runs in the same image")
    out.append(f"command = {_list(plan.command)}")
    out += _args(plan)
    if plan.role is not Role.ROUTER:
        out.append(_line(f"gpus = {plan.gpus}", plan.comments.get("gpus")))
        if plan.gpu_device_paths:
            paths = f"gpu_device_paths = {_list(plan.gpu_device_paths)}"
            out.append(_line(paths, plan.comments.get("gpu_device_paths")))
        out.append(
            _line(f"startup_budget_s = {plan.startup_budget_s}", plan.comments.get("startup_budget_s"))
        )
    if plan.env:
        out += ["", "[servers.env]"]
        for name, value in plan.env.items():
            secret = "secret-looking: keep this file readable by the daemon only (chmod 600)"
            out.append(
                _line(f"{_key(name)} = {toml_str(value)}", secret if SECRET_ENV.search(name) else None)
            )
    out += ["", "[servers.probes]"]
    if plan.role is Role.ROUTER:
        out += ['expected_tool_parser = "none"', 'expected_reasoning_parser = "none"']
    elif plan.expected is None:
        note = "model family not recognised: parsers not checked"
        out += [_line('expected_tool_parser = "auto"', note), 'expected_reasoning_parser = "auto"']
    else:
        tool, reasoning = (name or "unset" for name in plan.expected)
        out.append(_line('expected_tool_parser = "auto"', f"{tool}, from the model family"))
        out.append(_line('expected_reasoning_parser = "auto"', reasoning))
    if plan.health_timeout_s is not None:
        out.append(_line(f"health_timeout_s = {plan.health_timeout_s}", "above SGLANG_HEALTH_CHECK_TIMEOUT"))
    if plan.role is not Role.ROUTER:
        fix = "a parser misconfiguration relaunches with the family's parsers"
        out += ["", "[servers.policy]", _line('parser_policy = "fix"', fix)]
    return out


def render_config(plans: Sequence[ServerPlan]) -> str:
    """The config file: `[supervisor]` as the shipped unit expects, one `[[servers]]` per plan, alerts to fill."""
    sources = ", ".join(dict.fromkeys(p.source for p in plans))
    container = next((p.container for p in plans if p.container is not None), None)
    check = (
        f"inside the image: sglang-supervisor check-config --config {suggest.CONFIG_IN_IMAGE}"
        if container
        else "sudo -u sglang sglang-supervisor check-config --config THIS_FILE"
    )
    state, logs = (
        ("in the container", "in the container")
        if container
        else ("the unit's StateDirectory=", "the unit's LogsDirectory=")
    )
    out = [
        f"# Imported from {sources} by `sglang-supervisor import`.",
        "# Every field: docs/config.md (`sglang-supervisor files config-reference`). Before starting the daemon:",
        f"#   {check}",
        "",
        "[supervisor]",
        _line(
            f"state_dir = {toml_str(STATE_DIR)}",
            f"{state}: state.json, incidents, forensics",
        ),
        _line(f"log_dir = {toml_str(LOG_DIR)}", f"{logs}: <server>.log, SGLang's output"),
        'gpu_backend = "nvml"',
        "",
        "[supervisor.http]",
        *_http(container),
        _line('token_file = ""', "a file holding the bearer token of POST /control/*; empty = control off"),
    ]
    for plan in plans:
        out += ["", *_server(plan)]
    out += [
        "",
        "# Alerts: uncomment one sink (docs/config.md, [alerts]); secrets are named, never written here.",
        "# [alerts.webhook]",
        '# url_env = "ALERT_WEBHOOK_URL"',
    ]
    return "\n".join(out) + "\n"


def _http(container: Container | None) -> list[str]:
    """Where the status server listens: loopback, or in a container of its own network every address of it."""
    if container is None or suggest.shares_host_network(container):
        note = "/status, /metrics, /incidents: loopback; elsewhere needs token_file"
        return [_line('host = "127.0.0.1"', note), f"port = {suggest.STATUS_PORT}"]
    return [
        _line('host = "0.0.0.0"', "every address of the container: the published port reaches it"),
        f"port = {suggest.STATUS_PORT}",
        _line(
            "allow_public_without_token = true",
            f"published on the host's loopback ({suggest.STATUS_PUBLISH})",
        ),
    ]


def render_summary(plans: Sequence[ServerPlan], written_to: str | None) -> str:
    """What was read and inferred per server, then what to check (secret-looking values masked)."""
    where = written_to or "stdout"
    out = [f"sglang-supervisor import: {len(plans)} server(s) → {where}"]
    for plan in plans:
        out += ["", f"server {plan.name} ({plan.role.value}) from {plan.source}"]
        out += [f"  - {line}" for line in plan.inferred]
        out.append(f"  - args now: {' '.join(argv.redact(plan.args))}")
        out.append(f"  - env now: {env_summary(plan.env)}")
        out += [f"  - dropped {line}" for line in plan.removed]
        if plan.check:
            out.append("  check:")
            out += [f"  ! {line}" for line in plan.check]
    container = next((p.container for p in plans if p.container is not None), None)
    if container is not None:
        return "\n".join([*out, *suggest.summary(container, written_to)]) + "\n"
    target = written_to or "FILE"
    out += [
        "",
        "check as well: the supervisor starts SGLang as its unit's user (sglang), which must read the venv and "
        "the model; stop the old unit (systemctl disable --now UNIT) before starting the supervisor.",
        f"next: sudo -u sglang sglang-supervisor check-config --config {target}",
    ]
    return "\n".join(out) + "\n"
