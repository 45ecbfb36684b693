"""The daemon's configuration: TOML → frozen pydantic models, validated once at load (docs/config.md).

`load_config(path)` raises `ConfigError` listing every problem with its dotted field path, the value
and what is allowed. Overrides come from `SGLSUP_<SECTION>__<KEY>...` environment variables.
"""

from __future__ import annotations

import copy
import os
import tomllib
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, ValidationError
from pydantic import ValidationInfo as _Info

from policies.ladders import DEFAULT_LADDERS, Ladder, parse_ladders
from policies.parsers_table import REASONING_PARSERS, TOOL_PARSERS, expected_parsers
from policies.pd import Role, start_order

ENV_PREFIX = "SGLSUP_"
SGLANG_DEFAULT_PORT = 30000
SGLANG_HEALTH_TIMEOUT_S = 20  # SGLANG_HEALTH_CHECK_TIMEOUT's default inside SGLang
_SECRET_MAX_BYTES = 64 * 1024
_ALIASES = {
    "port": ("--port",),
    "tp": ("--tp-size", "--tp", "--tensor-parallel-size"),
    "dp": ("--dp-size", "--dp", "--data-parallel-size"),
    "pp": ("--pp-size", "--pipeline-parallel-size"),
    "model": ("--model-path", "--model"),
}


@dataclass(frozen=True, slots=True)
class FieldError:
    """One problem: the dotted path (`servers[0].probes.health_timeout_s`), the value, what is allowed."""

    path: str
    value: object
    allowed: str

    def __str__(self) -> str:
        return f"{self.path}: got {self.value!r}; {self.allowed}"


class ConfigError(Exception):
    """The configuration is invalid; `errors` lists every problem found."""

    def __init__(self, errors: Sequence[FieldError]) -> None:
        self.errors = list(errors)
        super().__init__(self.format_errors())

    def format_errors(self) -> str:
        """One line per error."""
        return "\n".join(str(e) for e in self.errors)


def _resolve(value: Path | None, info: _Info) -> Path | None:
    base = (info.context or {}).get("base_dir")
    if value is None or value.is_absolute() or base is None:
        return value
    return Path(base) / value


ConfigPath = Annotated[Path, AfterValidator(_resolve)]
OptionalPath = Annotated[
    Path | None, BeforeValidator(lambda v: None if v == "" else v), AfterValidator(_resolve)
]
Port = Annotated[int, Field(ge=1, le=65535)]


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class HttpConfig(_Model):
    """`[supervisor.http]`: the status/metrics/control endpoint."""

    host: str = "127.0.0.1"
    port: int = Field(9400, ge=0, le=65535)
    token_file: OptionalPath = None


class RestartConfig(_Model):
    """`[supervisor.restart]`: restart budget and backoff (satisfies `policies.backoff.RestartParams`)."""

    restarts: int = Field(5, ge=0)
    window_s: float = Field(600, gt=0)
    initial_s: float = Field(5, ge=0)
    factor: float = Field(2, ge=1)
    max_s: float = Field(300, gt=0)
    jitter: float = Field(0.2, ge=0, lt=1)
    stable_after_s: float = Field(600, gt=0)
    slow_retry_s: float = Field(1800, ge=0)


class SupervisorConfig(_Model):
    """`[supervisor]`: the daemon itself."""

    state_dir: ConfigPath = Path("/var/lib/sglang-supervisor")
    log_dir: ConfigPath = Path("/var/log/sglang-supervisor")
    shm_dir: ConfigPath = Path("/dev/shm")
    gpu_backend: Literal["nvml", "sim", "none"] = "nvml"
    sim_state_dir: OptionalPath = None
    tick_s: float = Field(0.5, gt=0, le=60)
    gpu_mem_free_threshold_mib: int = Field(1024, ge=0)
    release_deadline_s: float = Field(60, gt=0)
    allowlist: tuple[str, ...] = ("nvidia-persistenced", "nv-hostengine", "dcgm*")
    http: HttpConfig = HttpConfig()
    restart: RestartConfig = RestartConfig()


class ProbesConfig(_Model):
    """`[servers.probes]`: probe periods, timeouts and the parsers the canary expects."""

    health_period_s: float = Field(10, gt=0)
    health_timeout_s: float = Field(35, gt=0)
    health_failures: int = Field(3, ge=1)
    canary_period_s: float = Field(300, gt=0)
    canary_timeout_s: float = Field(60, gt=0)
    stream_canary_concurrency: int = Field(32, ge=1, le=256)
    stream_canary_period_s: float = Field(1800, ge=0)
    stall_after_s: float = Field(20, gt=0)
    metrics_period_s: float = Field(5, gt=0)
    expected_tool_parser: str = "auto"
    expected_reasoning_parser: str = "auto"
    canary_mode: Literal["require", "advisory", "off"] = "require"
    canary_inconclusive_limit: int = Field(3, ge=1, le=100)


class PolicyConfig(_Model):
    """`[servers.policy]`: what to do about parser faults, and ladder overrides."""

    parser_policy: Literal["fix", "alert"] = "fix"
    ladders: dict[str, tuple[tuple[str, ...], ...]] = {}
    promote_back: bool = False
    promote_after_s: float = Field(86400, gt=0)


class ServerConfig(_Model):
    """`[[servers]]`: one SGLang server (or router) and what it owns."""

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_-]{0,62}$")
    role: Role = Role.UNIFIED
    command: tuple[str, ...] = Field(min_length=1)
    args: tuple[str, ...] = ()
    env: dict[str, str] = {}
    gpus: tuple[Annotated[int, Field(ge=0, le=255)], ...] = ()
    gpu_device_paths: tuple[ConfigPath, ...] = ()
    ports: tuple[Port, ...] = ()
    startup_budget_s: float = Field(1800, gt=0)
    startup_silence_s: float = Field(300, gt=0)
    drain_grace_s: float = Field(30, ge=0)
    depends_on: tuple[str, ...] = ()
    probes: ProbesConfig = ProbesConfig()
    policy: PolicyConfig = PolicyConfig()

    @property
    def argv(self) -> tuple[str, ...]:
        """The full command line: `command` then `args`."""
        return (*self.command, *self.args)

    @property
    def http_port(self) -> int:
        """`--port` from args (`--port N` or `--port=N`), else SGLang's default 30000."""
        return _int_arg(self.args, "port") or SGLANG_DEFAULT_PORT

    @property
    def tp_size(self) -> int:
        """Tensor-parallel size (`--tp-size`, `--tp`, `--tensor-parallel-size`), default 1."""
        return _int_arg(self.args, "tp") or 1

    @property
    def dp_size(self) -> int:
        """Data-parallel size (`--dp-size`, `--dp`, `--data-parallel-size`), default 1."""
        return _int_arg(self.args, "dp") or 1

    @property
    def pp_size(self) -> int:
        """Pipeline-parallel size (`--pp-size`, `--pipeline-parallel-size`), default 1."""
        return _int_arg(self.args, "pp") or 1

    @property
    def model_path(self) -> str | None:
        """`--model-path` (or `--model`) from args."""
        return arg_value(self.args, _ALIASES["model"])

    @property
    def device_paths(self) -> tuple[Path, ...]:
        """The device nodes this server owns: `gpu_device_paths`, else `/dev/nvidia{N}` per GPU."""
        return self.gpu_device_paths or tuple(Path(f"/dev/nvidia{n}") for n in self.gpus)

    @property
    def sglang_health_timeout_s(self) -> int:
        """SGLang's own /health wait: `SGLANG_HEALTH_CHECK_TIMEOUT` from `env`, default 20."""
        raw = self.env.get("SGLANG_HEALTH_CHECK_TIMEOUT", "")
        return int(raw) if raw.strip().isdigit() else SGLANG_HEALTH_TIMEOUT_S

    @property
    def ladders(self) -> dict[str, Ladder]:
        """Default ladders with this server's overrides (an override replaces that key's ladder)."""
        return {**DEFAULT_LADDERS, **parse_ladders(self.policy.ladders)[0]}

    def expected_parsers(self) -> tuple[str | None, str | None] | None:
        """(tool, reasoning) the server must run with (None = flag unset); None when unknown."""
        table = expected_parsers(self.model_path or "")
        out: list[str | None] = []
        for i, want in enumerate((self.probes.expected_tool_parser, self.probes.expected_reasoning_parser)):
            if want == "auto" and table is None:
                return None
            out.append(table[i] if want == "auto" and table else None if want == "none" else want)
        return out[0], out[1]


class WebhookSink(_Model):
    """`[alerts.webhook]`: generic JSON webhook, optionally HMAC-signed."""

    url_file: OptionalPath = None
    url_env: str = ""
    hmac_secret_file: OptionalPath = None
    hmac_secret_env: str = ""


class SlackSink(_Model):
    """`[alerts.slack]`: Slack incoming webhook."""

    url_file: OptionalPath = None
    url_env: str = ""


class PagerDutySink(_Model):
    """`[alerts.pagerduty]`: PagerDuty Events API v2."""

    routing_key_file: OptionalPath = None
    routing_key_env: str = ""


class AlertmanagerSink(_Model):
    """`[alerts.alertmanager]`: Alertmanager base URL (`/api/v2/alerts` is appended)."""

    url: str = Field(pattern=r"^https?://\S+$")


class AlertsConfig(_Model):
    """`[alerts]`: sinks and delivery limits."""

    webhook: WebhookSink | None = None
    slack: SlackSink | None = None
    pagerduty: PagerDutySink | None = None
    alertmanager: AlertmanagerSink | None = None
    rate_limit_per_min: int = Field(10, ge=1)
    queue_size: int = Field(1000, ge=1)
    timeout_s: float = Field(5, gt=0)
    retries: int = Field(3, ge=0)


class Config(_Model):
    """The whole file."""

    supervisor: SupervisorConfig = SupervisorConfig()
    servers: tuple[ServerConfig, ...]
    alerts: AlertsConfig = AlertsConfig()

    def server(self, name: str) -> ServerConfig:
        """The server called `name` (KeyError if none)."""
        for s in self.servers:
            if s.name == name:
                return s
        raise KeyError(name)

    @property
    def roles(self) -> dict[str, Role]:
        """Server name → role, in file order."""
        return {s.name: s.role for s in self.servers}


def arg_value(args: Sequence[str], names: Sequence[str]) -> str | None:
    """Value of the last occurrence of any of `names` (`--flag value` or `--flag=value`)."""
    found: str | None = None
    for i, token in enumerate(args):
        flag, eq, value = token.partition("=")
        if flag in names:
            found = value if eq else (args[i + 1] if i + 1 < len(args) else "")
    return found


def _int_arg(args: Sequence[str], key: str) -> int | None:
    raw = arg_value(args, _ALIASES.get(key, (key,)))
    return int(raw) if raw is not None and raw.isdigit() and int(raw) > 0 else None


def read_secret(file: Path | None, env_name: str, env: Mapping[str, str] | None = None) -> str | None:
    """A secret from its file (first 64 KiB, stripped) or environment variable; None when unset."""
    if file is not None:
        with file.open("rb") as fh:
            return fh.read(_SECRET_MAX_BYTES).decode().strip()
    source = os.environ if env is None else env
    return source.get(env_name) if env_name else None


# ---- loading


def load_config(path: str | Path, env: Mapping[str, str] = os.environ) -> Config:
    """Read, override from `SGLSUP_*` variables in `env`, validate; raises ConfigError."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError([FieldError(str(path), None, f"a readable UTF-8 file ({exc})")]) from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError([FieldError(str(path), None, f"valid TOML ({exc})")]) from exc
    return parse_config(data, base_dir=path.parent, env=env)


def parse_config(data: Mapping[str, Any], base_dir: Path, env: Mapping[str, str]) -> Config:
    """Validate a decoded TOML document; relative paths are resolved against `base_dir`."""
    data, errors = apply_env_overrides(data, env)
    if errors:
        raise ConfigError(errors)
    try:
        config = Config.model_validate(data, context={"base_dir": base_dir})
    except ValidationError as exc:
        raise ConfigError([_field_error(e) for e in exc.errors()]) from None
    errors = check_config(config, env)
    if errors:
        raise ConfigError(errors)
    return config


def apply_env_overrides(
    data: Mapping[str, Any], env: Mapping[str, str]
) -> tuple[dict[str, Any], list[FieldError]]:
    """Apply `SGLSUP_SECTION__KEY[__KEY...]=VALUE` overrides (VALUE read as a TOML value, else a string).

    Keys are case-insensitive; a `servers` element is named by index or by `name`. Variables with the
    prefix that do not start with a section (`supervisor`, `servers`, `alerts`) are ignored.
    """
    doc = copy.deepcopy(dict(data))
    errors: list[FieldError] = []
    for var in sorted(k for k in env if k.startswith(ENV_PREFIX)):
        keys = var[len(ENV_PREFIX) :].lower().split("__")
        if len(keys) < 2 or keys[0] not in Config.model_fields:
            continue
        node: Any = doc
        for i, key in enumerate(keys[:-1]):
            node = _child(node, key)
            if node is None:
                errors.append(FieldError(f"env {var}", env[var], f"no element {'.'.join(keys[: i + 1])}"))
                break
        else:
            try:
                node[keys[-1]] = tomllib.loads(f"v = {env[var]}")["v"]
            except tomllib.TOMLDecodeError:
                node[keys[-1]] = env[var]
    return doc, errors


def _child(node: Any, key: str) -> Any:
    if isinstance(node, list):
        if key.isdigit():
            return node[int(key)] if int(key) < len(node) and isinstance(node[int(key)], dict) else None
        return next((e for e in node if isinstance(e, dict) and e.get("name") == key), None)
    if not isinstance(node, dict):
        return None
    if key not in node:
        node[key] = [] if key == "servers" else {}
    return node[key]


def _field_error(err: Mapping[str, Any]) -> FieldError:
    loc = tuple(err["loc"])
    path = _dotted(loc)
    value = "<redacted>" if ".env." in f"{path}." else err.get("input")
    if err["type"] == "missing":
        value = "(missing)"
    allowed = str(err["msg"])
    if err["type"] == "extra_forbidden":
        allowed = f"unknown key; known keys: {', '.join(_known_keys(loc[:-1]))}"
    return FieldError(path, value, allowed)


def _dotted(loc: Sequence[str | int]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(root)"


def _known_keys(loc: Sequence[str | int]) -> list[str]:
    model: type[BaseModel] | None = Config
    for part in loc:
        if isinstance(part, int) or model is None:
            continue
        field = model.model_fields.get(part)
        model = _model_in(field.annotation) if field else None
    return sorted(model.model_fields) if model else []


def _model_in(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) in (tuple, typing.Union):
        return next((m for a in typing.get_args(annotation) if (m := _model_in(a))), None)
    return None


# ---- cross-field checks


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
    for key in ("port", "tp", "dp", "pp"):
        raw = arg_value(s.args, _ALIASES[key])
        if raw is not None and _int_arg(s.args, key) is None:
            errors.append(FieldError(f"{at}.args", raw, f"{_ALIASES[key][0]} takes a positive integer"))
    if s.http_port > 65535:
        errors.append(FieldError(f"{at}.args", s.http_port, "--port in 1..65535"))
    mode = arg_value(s.args, ("--disaggregation-mode",))
    want_mode = s.role.value if s.role in (Role.PREFILL, Role.DECODE) else None
    if (mode if mode != "null" else None) != want_mode:
        allowed = (
            f"--disaggregation-mode {want_mode}" if want_mode else "no --disaggregation-mode prefill|decode"
        )
        errors.append(FieldError(f"{at}.args", mode, f"role {s.role} needs {allowed}"))
    if s.role is not Role.ROUTER and not s.model_path:
        errors.append(FieldError(f"{at}.args", None, "--model-path MODEL"))
    for flag, known in (("--tool-call-parser", TOOL_PARSERS), ("--reasoning-parser", REASONING_PARSERS)):
        value = arg_value(s.args, (flag,))
        if value is not None and value != "auto" and value not in known:
            errors.append(FieldError(f"{at}.args", value, f"{flag}: auto or a parser name of SGLang 0.5.23"))
    for key, known in (("tool", TOOL_PARSERS), ("reasoning", REASONING_PARSERS)):
        value = getattr(s.probes, f"expected_{key}_parser")
        if value not in known | {"auto", "none"}:
            errors.append(
                FieldError(f"{at}.probes.expected_{key}_parser", value, "'auto', 'none' or a parser name")
            )
    errors += _check_resources(config, at, s, ports, gpus)
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
        dp_attention = "--enable-dp-attention" in s.args
        need = s.tp_size * s.pp_size * (1 if dp_attention else s.dp_size)
        if len(set(s.gpus)) < need:
            errors.append(FieldError(f"{at}.gpus", list(s.gpus), f"{need} distinct GPUs (tp × pp × dp)"))
    if s.gpu_device_paths and len(s.gpu_device_paths) != len(s.gpus):
        errors.append(
            FieldError(f"{at}.gpu_device_paths", len(s.gpu_device_paths), "one path per GPU, or none")
        )
    for gpu in s.gpus:
        if gpus.setdefault(gpu, at) != at:
            errors.append(FieldError(f"{at}.gpus", gpu, f"a GPU not owned by {gpus[gpu]}"))
    owned = [(s.http_port, f"{at}.args")] + [(p, f"{at}.ports") for p in s.ports]
    if s.role is Role.PREFILL:
        bootstrap = _int_arg(s.args, "--disaggregation-bootstrap-port") or 8998
        owned.append((bootstrap, f"{at}.args"))
    for port, path in owned:
        if ports.setdefault(port, path) != path:
            errors.append(FieldError(path, port, f"a port not already used by {ports[port]}"))
    return errors
