"""Checks that span fields or touch the file system: ports, GPUs, roles, secrets, SGLang's args."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlsplit

from policies import argv
from policies.ladders import parse_ladders
from policies.parsers_table import REASONING_PARSERS, TOOL_PARSERS, ExpectedParsers
from policies.pd import Role, start_order
from policies.plan import parser_mismatches
from supervisor.config.errors import FieldError
from supervisor.config.group import check_group
from supervisor.config.models import Config, ServerConfig


def check_config(config: Config, env: Mapping[str, str]) -> list[FieldError]:
    """Checks that span fields or touch the file system (secret files, env-held secrets)."""
    sup = config.supervisor
    errors: list[FieldError] = []
    if sup.gpu_backend == "sim" and sup.sim_state_dir is None:
        errors.append(FieldError("supervisor.sim_state_dir", None, "required when gpu_backend = 'sim'"))
    if sup.restart.initial_s > sup.restart.max_s:
        errors.append(FieldError("supervisor.restart.initial_s", sup.restart.initial_s, "at most max_s"))
    token = sup.http.token_file
    if token is not None and not token.is_file():
        errors.append(
            FieldError("supervisor.http.token_file", str(token), "an existing file (or '' for none)")
        )
    if token is None and not sup.http.allow_public_without_token and not is_loopback(sup.http.host):
        allowed = "a loopback address unless token_file is set (or allow_public_without_token = true)"
        errors.append(FieldError("supervisor.http.host", sup.http.host, allowed))
    ports: dict[int, str] = {sup.http.port: "supervisor.http.port"} if sup.http.port else {}
    gpus: dict[int, str] = {}
    for i, server in enumerate(config.servers):
        errors += _check_server(config, i, server, ports, gpus)
    names = {s.name for s in config.servers}
    edges = {s.name: [d for d in s.depends_on if d in names and d != s.name] for s in config.servers}
    if not config.servers:
        errors.append(FieldError("servers", [], "at least one [[servers]] table"))
    try:
        start_order(config.roles, edges)
    except ValueError as exc:
        errors.append(FieldError("servers", sorted(names), f"depends_on without cycles ({exc})"))
    if config.group is not None:
        listed = [s.name for s in config.servers]
        member = next((s for s in config.servers if s.name == config.group.server), None)
        arg = member.arg if member is not None else (lambda flag: None)
        canaries = (
            (member.probes.canary_mode, member.probes.stream_canary_period_s) if member else ("off", 0.0)
        )
        errors += [FieldError(*p) for p in check_group(config.group, listed, arg, canaries)]
    if config.gateway is not None:
        errors += _check_gateway(config)
    alerts = config.alerts
    sinks = {
        "webhook.url": alerts.webhook and (alerts.webhook.url_file, alerts.webhook.url_env, True),
        "webhook.hmac_secret": alerts.webhook
        and (alerts.webhook.hmac_secret_file, alerts.webhook.hmac_secret_env, False),
        "slack.url": alerts.slack and (alerts.slack.url_file, alerts.slack.url_env, True),
        "pagerduty.routing_key": alerts.pagerduty
        and (alerts.pagerduty.routing_key_file, alerts.pagerduty.routing_key_env, True),
    }
    for name, ref in sinks.items():
        if ref:
            errors += _check_secret(f"alerts.{name}", *ref, env)
    return errors


def _check_secret(
    path: str, file: Path | None, env_name: str, required: bool, env: Mapping[str, str]
) -> list[FieldError]:
    if file is not None and env_name:
        return [FieldError(f"{path}_env", env_name, f"either {path}_file or {path}_env, not both")]
    if file is not None and not file.is_file():
        return [FieldError(f"{path}_file", str(file), "an existing file holding the secret")]
    if env_name and env_name not in env:
        return [FieldError(f"{path}_env", env_name, "the name of a variable set in the daemon's environment")]
    if required and file is None and not env_name:
        return [FieldError(f"{path}_file", None, f"{path}_file or {path}_env")]
    return []


def _check_server(
    config: Config, i: int, s: ServerConfig, ports: dict[int, str], gpus: dict[int, str]
) -> list[FieldError]:
    at = f"servers[{i}]"
    errors: list[FieldError] = []
    names = [x.name for x in config.servers]
    if names.index(s.name) != i:
        errors.append(FieldError(f"{at}.name", s.name, "a name no other server has"))
    bad_deps = [d for d in s.depends_on if d not in names or d == s.name]
    if bad_deps:
        errors.append(FieldError(f"{at}.depends_on", bad_deps, f"names of other servers: {names}"))
    for flag in ("--port", "--tp-size", "--dp-size", "--pp-size"):
        given = argv.last(s.args, flag, s.flags)
        if given is not None and s.positive_arg(flag) is None:
            raw = given.values[-1] if given.values else ""
            errors.append(FieldError(f"{at}.args", raw, f"{flag} takes a positive integer"))
    if s.http_port > 65535:
        errors.append(FieldError(f"{at}.args", s.http_port, "--port in 1..65535"))
    mode = s.arg("--disaggregation-mode")
    want_mode = s.role.value if s.role in (Role.PREFILL, Role.DECODE) else None
    if (mode if mode != "null" else None) != want_mode:
        allowed = (
            f"--disaggregation-mode {want_mode}" if want_mode else "no --disaggregation-mode prefill|decode"
        )
        errors.append(FieldError(f"{at}.args", mode, f"role {s.role} needs {allowed}"))
    if s.role is not Role.ROUTER and not s.model_path:
        errors.append(FieldError(f"{at}.args", None, "--model-path MODEL"))
    for flag, known in (("--tool-call-parser", TOOL_PARSERS), ("--reasoning-parser", REASONING_PARSERS)):
        value = s.arg(flag)
        if value is not None and value != "auto" and value not in known:
            errors.append(FieldError(f"{at}.args", value, f"{flag}: auto or a parser name of SGLang 0.5.23"))
    for key, known in (("tool", TOOL_PARSERS), ("reasoning", REASONING_PARSERS)):
        value = getattr(s.probes, f"expected_{key}_parser")
        if value not in known | {"auto", "none"}:
            errors.append(
                FieldError(f"{at}.probes.expected_{key}_parser", value, "'auto', 'none' or a parser name")
            )
    errors += _check_resources(config, at, s, ports, gpus)
    if s.api_key_file is not None and not s.api_key_file.is_file():
        allowed = "an existing file holding the key"
        errors.append(FieldError(f"{at}.api_key_file", str(s.api_key_file), allowed))
    raw_timeout = s.env.get("SGLANG_HEALTH_CHECK_TIMEOUT")
    if raw_timeout is not None and not raw_timeout.strip().isdigit():
        errors.append(
            FieldError(f"{at}.env.SGLANG_HEALTH_CHECK_TIMEOUT", raw_timeout, "an integer (SGLang's rule)")
        )
    if s.probes.health_timeout_s <= s.sglang_health_timeout_s:
        allowed = f"more than SGLang's own health wait ({s.sglang_health_timeout_s} s)"
        errors.append(FieldError(f"{at}.probes.health_timeout_s", s.probes.health_timeout_s, allowed))
    if s.startup_silence_s > s.startup_budget_s:
        errors.append(FieldError(f"{at}.startup_silence_s", s.startup_silence_s, "at most startup_budget_s"))
    for issue in parse_ladders(s.policy.ladders)[1]:
        errors.append(FieldError(f"{at}.policy.ladders.{issue.path}", issue.value, issue.allowed))
    return errors


def is_loopback(host: str) -> bool:
    """True for `localhost` and loopback IP literals (127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _check_resources(
    config: Config, at: str, s: ServerConfig, ports: dict[int, str], gpus: dict[int, str]
) -> list[FieldError]:
    errors: list[FieldError] = []
    if s.role is Role.DECODE and Role.PREFILL not in config.roles.values():
        errors.append(
            FieldError(f"{at}.role", s.role.value, "decode only with a prefill server in the deployment")
        )
    if s.role is Role.ROUTER and s.gpus:
        errors.append(FieldError(f"{at}.gpus", list(s.gpus), "none: a router owns no GPU"))
    if s.role is not Role.ROUTER and config.supervisor.gpu_backend != "none":
        nnodes = s.nnodes
        need = s.tp_size * s.pp_size * (1 if s.attn_dp_size > 1 else s.dp_size) // nnodes
        if len(set(s.gpus)) < need:
            per = f" / {nnodes} nodes" if nnodes > 1 else ""
            errors.append(FieldError(f"{at}.gpus", list(s.gpus), f"{need} distinct GPUs (tp × pp × dp{per})"))
    if s.gpu_device_paths and len(s.gpu_device_paths) != len(s.gpus):
        errors.append(
            FieldError(f"{at}.gpu_device_paths", len(s.gpu_device_paths), "one path per GPU, or none")
        )
    for gpu in s.gpus:
        if gpus.setdefault(gpu, at) != at:
            errors.append(FieldError(f"{at}.gpus", gpu, f"a GPU not owned by {gpus[gpu]}"))
    owned = [(s.http_port, f"{at}.args")] + [(p, f"{at}.ports") for p in s.ports]
    if s.role is Role.PREFILL:
        bootstrap = s.positive_arg("--disaggregation-bootstrap-port") or 8998
        owned.append((bootstrap, f"{at}.args"))
    for port, path in owned:
        if ports.setdefault(port, path) != path:
            errors.append(FieldError(path, port, f"a port not already used by {ports[port]}"))
    return errors


def parser_warnings(config: Config) -> list[str]:
    """What each server's parsers will cost at its first launch: the args differ from the model family's."""
    found = []
    for i, server in enumerate(config.servers):
        expected = server.expected_parsers()
        if server.role is Role.ROUTER or expected is None:
            continue
        wrong = parser_mismatches(server.args, ExpectedParsers(*expected))
        if not wrong:
            continue
        if server.policy.parser_policy == "fix":
            cost = "the daemon launches with the family's parsers instead (parser_policy = fix): put them in args"
        else:
            cost = "the server will serve degraded and alert (parser_policy = alert): agent clients get raw markup"
        found.append(f"servers[{i}].args ({server.name}): {'; '.join(wrong)} — {cost}")
    return found


def _check_gateway(config: Config) -> list[FieldError]:
    """`[gateway]`: a readable key file, and URLs that can reach each other (a loopback worker URL is useless
    to a gateway on another host; a gateway on loopback cannot reach a worker advertised beyond it either)."""
    gw = config.gateway
    assert gw is not None
    errors: list[FieldError] = []
    if gw.admin_key_file is not None and not gw.admin_key_file.is_file():
        errors.append(FieldError("gateway.admin_key_file", str(gw.admin_key_file), "an existing file"))
    gateway_local = is_loopback(urlsplit(gw.url).hostname or "")
    for i, s in enumerate(config.servers):
        if s.role.value == "router":
            continue
        worker_local = is_loopback(urlsplit(s.gateway_url).hostname or "")
        if worker_local != gateway_local:
            where = "a loopback" if gateway_local else "a non-loopback"
            errors.append(
                FieldError(
                    f"servers[{i}].advertise_url",
                    s.gateway_url,
                    f"a URL the gateway at {gw.url} can reach ({where} address, as the gateway's)",
                )
            )
    return errors
