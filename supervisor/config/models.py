"""The typed configuration: frozen pydantic models, one per TOML table (docs/config.md)."""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field
from pydantic import ValidationInfo as _Info

from policies import argv
from policies.argv import FlagTable
from policies.ladders import DEFAULT_LADDERS, Ladder, parse_ladders
from policies.parsers_table import expected_parsers
from policies.pd import Role
from supervisor import packaged
from supervisor.config.group import GroupConfig

SGLANG_DEFAULT_PORT = 30000
SGLANG_DEFAULT_HOST = "127.0.0.1"
SGLANG_HEALTH_TIMEOUT_S = 20  # SGLANG_HEALTH_CHECK_TIMEOUT's default inside SGLang


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
    allow_public_without_token: bool = False  # bind beyond loopback with no token: an explicit choice
    # what clients can make the daemon's loop do (supervisor.reporting.admission, status_cache)
    max_connections: int = Field(64, ge=1, le=65536)
    max_requests_per_s: float = Field(500, gt=0)
    idle_timeout_s: float = Field(5, gt=0, le=300)
    cache_s: float = Field(0.25, ge=0, le=60)


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
    immediate_first: bool = True


class SupervisorConfig(_Model):
    """`[supervisor]`: the daemon itself."""

    state_dir: ConfigPath = Path("/var/lib/sglang-supervisor")
    log_dir: ConfigPath = Path("/var/log/sglang-supervisor")
    shm_dir: ConfigPath = Path("/dev/shm")
    gpu_backend: Literal["nvml", "sim", "none"] = "nvml"
    sim_state_dir: OptionalPath = None
    tick_s: float = Field(1.0, gt=0, le=60)
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
    stream_canary_first_s: float = Field(30, ge=0)
    stall_after_s: float = Field(20, gt=0)
    rank_stall_after_s: float = Field(6, gt=0)
    stuck_request_min_s: float = Field(300, gt=0)
    stuck_request_factor: float = Field(5, gt=1)
    brownout_after_s: float = Field(120, gt=0)
    brownout_fraction: float = Field(0.3, gt=0, lt=1)
    metrics_period_s: float = Field(5, gt=0)
    expected_tool_parser: str = "auto"
    expected_reasoning_parser: str = "auto"
    canary_mode: Literal["require", "advisory", "off"] = "require"
    canary_inconclusive_limit: int = Field(3, ge=1, le=100)
    max_pause_s: float = Field(1800, gt=0)


class PolicyConfig(_Model):
    """`[servers.policy]`: what to do about parser faults, and ladder overrides."""

    parser_policy: Literal["fix", "alert"] = "fix"
    brownout_policy: Literal["alert", "restart"] = "alert"
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
    api_key_file: OptionalPath = None  # the key the server requires, when it is not in args
    advertise_url: str | None = Field(None, pattern=r"^https?://[^\s/]+$")  # how the gateway reaches it
    probes: ProbesConfig = ProbesConfig()
    policy: PolicyConfig = PolicyConfig()

    @property
    def argv(self) -> tuple[str, ...]:
        """The full command line: `command` then `args`."""
        return (*self.command, *self.args)

    @property
    def flags(self) -> FlagTable:
        """How `args` are read: as SGLang's `launch_server` parser reads them; a router's by exact spelling."""
        return argv.EXACT if self.role is Role.ROUTER else argv.SGLANG

    def arg(self, flag: str) -> str | None:
        """The value SGLang keeps for `flag` (last occurrence, any alias or abbreviation); None if unset."""
        return argv.value(self.args, flag, self.flags)

    def positive_arg(self, flag: str) -> int | None:
        """`flag`'s value when it is a positive integer; None when unset or not one (see `check_config`)."""
        raw = self.arg(flag)
        return int(raw) if raw is not None and raw.isdigit() and int(raw) > 0 else None

    @property
    def http_port(self) -> int:
        """`--port` from args, else SGLang's default 30000."""
        return self.positive_arg("--port") or SGLANG_DEFAULT_PORT

    @property
    def bind_host(self) -> str:
        """Where the server binds its HTTP port: `--host` (an IPv6 literal without brackets), default 127.0.0.1."""
        raw = self.arg("--host")
        if raw is None:
            return SGLANG_DEFAULT_HOST
        return raw[1:-1] if raw.startswith("[") and raw.endswith("]") else raw

    @property
    def base_url(self) -> str:
        """Where the probes reach this server's HTTP port: its `bind_host` as SGLang's `ServerArgs.url()` makes it."""
        return f"http://{url_host(self.bind_host)}:{self.http_port}"

    @property
    def gateway_url(self) -> str:
        """The URL the gateway reaches this server by: `advertise_url`, else `base_url`."""
        return self.advertise_url or self.base_url

    @property
    def bootstrap_port(self) -> int | None:
        """A PD prefill's bootstrap port (`--disaggregation-bootstrap-port`, SGLang's default 8998)."""
        if self.role is not Role.PREFILL:
            return None
        return self.positive_arg("--disaggregation-bootstrap-port") or 8998

    @property
    def tp_size(self) -> int:
        """Tensor-parallel size (`--tp-size` or its alias or abbreviation), default 1."""
        return self.positive_arg("--tp-size") or 1

    @property
    def dp_size(self) -> int:
        """Data-parallel size (`--dp-size` or its alias or abbreviation), default 1."""
        return self.positive_arg("--dp-size") or 1

    @property
    def attn_dp_size(self) -> int:
        """Attention-DP groups, which split the TP group (tp × pp GPUs, `scheduler_DP1_TP1` …): `--attn-dp-size`, or
        `--dp-size` with the deprecated `--enable-dp-attention` (SGLang 0.5.23 turns the one into the other)."""
        if argv.present(self.args, "--enable-dp-attention", self.flags):
            return self.positive_arg("--attn-dp-size") or self.dp_size
        return self.positive_arg("--attn-dp-size") or 1

    @property
    def dp_ranks(self) -> int:
        """DP ranks, each a scheduler loop with its own `/v1/loads` snapshot: replicas × attention-DP groups (one
        of the two is 1)."""
        return self.attn_dp_size if self.attn_dp_size > 1 else self.dp_size

    @property
    def pp_size(self) -> int:
        """Pipeline-parallel size (`--pp-size` or `--pipeline-parallel-size`), default 1."""
        return self.positive_arg("--pp-size") or 1

    @property
    def nnodes(self) -> int:
        """Nodes the server spans (`--nnodes`), default 1."""
        return self.positive_arg("--nnodes") or 1

    @property
    def node_rank(self) -> int:
        """This host's node of the server (`--node-rank`), default 0."""
        return self.positive_arg("--node-rank") or 0

    @property
    def model_path(self) -> str | None:
        """`--model-path` (or `--model`) from args."""
        return self.arg("--model-path")

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


def url_host(host: str) -> str:
    """A bind address as the host of a URL that reaches it from this machine."""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return host or SGLANG_DEFAULT_HOST  # a name (`localhost`, the machine's), or empty: every address
    if ip.version == 6:
        return "[::1]" if ip.is_unspecified else f"[{host}]"
    return SGLANG_DEFAULT_HOST if ip.is_unspecified else host


class WebhookSinkConfig(_Model):
    """`[alerts.webhook]`: generic JSON webhook, optionally HMAC-signed."""

    url_file: OptionalPath = None
    url_env: str = ""
    hmac_secret_file: OptionalPath = None
    hmac_secret_env: str = ""


class SlackSinkConfig(_Model):
    """`[alerts.slack]`: Slack incoming webhook."""

    url_file: OptionalPath = None
    url_env: str = ""


class PagerDutySinkConfig(_Model):
    """`[alerts.pagerduty]`: PagerDuty Events API v2."""

    routing_key_file: OptionalPath = None
    routing_key_env: str = ""


class AlertmanagerSinkConfig(_Model):
    """`[alerts.alertmanager]`: Alertmanager base URL (`/api/v2/alerts` is appended)."""

    url: str = Field(pattern=r"^https?://\S+$")


class AlertsConfig(_Model):
    """`[alerts]`: sinks, delivery limits and the base of the runbook links."""

    runbook_url: str = Field(default_factory=packaged.runbook_url, pattern=r"^(https?|file)://[^\s#]+$")
    webhook: WebhookSinkConfig | None = None
    slack: SlackSinkConfig | None = None
    pagerduty: PagerDutySinkConfig | None = None
    alertmanager: AlertmanagerSinkConfig | None = None
    rate_limit_per_min: int = Field(10, ge=1)
    queue_size: int = Field(1000, ge=1)
    timeout_s: float = Field(5, gt=0)
    retries: int = Field(3, ge=0)


class GatewayConfig(_Model):
    """`[gateway]`: SGLang's gateway (SMG, or sglang-router) in front of this host's servers."""

    url: str = Field(pattern=r"^https?://[^\s/]+/?$")
    admin_key_file: OptionalPath = None  # SMG's admin control-plane key, or sglang-router's --api-key
    min_available: int = Field(0, ge=0)  # other ready workers of the model a planned stop must leave
    timeout_s: float = Field(2.0, gt=0, le=30)  # every call to the gateway
    drain_s: float = Field(60.0, ge=0)  # a planned stop waits this long at most for the server's requests
    wait_available_s: float = Field(120.0, ge=0)  # and this long at most for min_available


class Config(_Model):
    """The whole file."""

    supervisor: SupervisorConfig = SupervisorConfig()
    servers: tuple[ServerConfig, ...]
    alerts: AlertsConfig = AlertsConfig()
    group: GroupConfig | None = None
    gateway: GatewayConfig | None = None

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
