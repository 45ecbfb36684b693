"""Configuration loading: TOML → frozen models, env overrides, derived helpers, dotted-path errors."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from policies.pd import Role
from supervisor.config import ConfigError, load_config
from tests.support.paths import REPO

ROOT = REPO
BAD = sorted((ROOT / "tests" / "configs" / "bad").glob("*.toml"))
SECRETS = {"ALERT_WEBHOOK_URL": "https://hooks.example/x", "ALERT_WEBHOOK_HMAC": "k"}

BASE = """
[supervisor]
state_dir = "state"
log_dir = "/var/log/sup"
gpu_backend = "none"

[[servers]]
name = "main"
command = ["python", "-m", "sglang.launch_server"]
args = [{args}]
gpus = [0]
{extra}
"""


def write(tmp_path: Path, args: str = '"--model-path", "Qwen/Qwen3-8B"', extra: str = "") -> Path:
    path = tmp_path / "sup.toml"
    path.write_text(BASE.format(args=args, extra=extra))
    return path


@pytest.mark.parametrize("name", ["kimi-k25-8gpu", "pd-1p1d", "simulator", "container", "gateway-2replicas"])
def test_examples_load(name: str, tmp_path: Path) -> None:
    """Every shipped example is a valid configuration (the container's with its token file where it mounts, the
    gateway's with its key file)."""
    token = tmp_path / "token"
    token.write_text("t\n")
    env = {**SECRETS, "SGLSUP_SUPERVISOR__HTTP__TOKEN_FILE": str(token)} if name == "container" else SECRETS
    if name == "gateway-2replicas":
        env = {**SECRETS, "SGLSUP_GATEWAY__ADMIN_KEY_FILE": str(token)}
    config = load_config(ROOT / "examples" / f"{name}.toml", env=env)
    assert config.servers


def test_pd_example_roles_and_ports() -> None:
    """The PD example has a prefill, a decode and a router with distinct HTTP ports."""
    config = load_config(ROOT / "examples" / "pd-1p1d.toml", env={})
    assert config.roles == {"prefill": Role.PREFILL, "decode": Role.DECODE, "router": Role.ROUTER}
    assert [s.http_port for s in config.servers] == [30000, 30001, 8000]
    assert config.server("decode").tp_size == 4


@pytest.mark.parametrize("path", BAD, ids=[p.stem for p in BAD])
def test_broken_config_names_its_field(path: Path) -> None:
    """Each broken config fails with exactly one error, at the field its first line names."""
    expected = path.read_text().splitlines()[0].removeprefix("# expect:").strip()
    with pytest.raises(ConfigError) as info:
        load_config(path, env={"HOME": "/root"})
    assert [e.path for e in info.value.errors] == [expected], info.value.format_errors()


def test_format_errors_one_line_per_error(tmp_path: Path) -> None:
    """format_errors() gives one line per problem, each with path, value and what is allowed."""
    path = write(tmp_path, extra="[servers.probes]\nhealth_period_s = -1\nhealth_failures = 0\n")
    with pytest.raises(ConfigError) as info:
        load_config(path, env={})
    lines = info.value.format_errors().splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("servers[0].probes.health_period_s: got -1;")
    assert lines[1].startswith("servers[0].probes.health_failures: got 0;")


def test_max_pause_s_must_be_positive(tmp_path: Path) -> None:
    """`max_pause_s` ≤ 0 would make every engine pause an incident: a config error at its field path."""
    path = write(tmp_path, extra="[servers.probes]\nmax_pause_s = 0\n")
    with pytest.raises(ConfigError) as info:
        load_config(path, env={})
    assert info.value.format_errors().startswith("servers[0].probes.max_pause_s: got 0;")
    assert load_config(write(tmp_path), env={}).servers[0].probes.max_pause_s == 1800


def test_defaults_are_the_documented_ones(tmp_path: Path) -> None:
    """Unset fields take the documented defaults."""
    config = load_config(write(tmp_path), env={})
    sup, server = config.supervisor, config.servers[0]
    assert (sup.tick_s, sup.http.host, sup.http.port, sup.http.token_file) == (1.0, "127.0.0.1", 9400, None)
    r = sup.restart
    assert (r.restarts, r.window_s, r.initial_s, r.factor, r.max_s) == (5, 600, 5, 2, 300)
    assert (r.jitter, r.stable_after_s, r.slow_retry_s) == (0.2, 600, 1800)
    assert (server.probes.health_timeout_s, server.startup_budget_s, server.policy.parser_policy) == (
        35,
        1800,
        "fix",
    )


def test_relative_paths_resolve_against_the_config_file(tmp_path: Path) -> None:
    """A relative path in the file is relative to the file's directory; absolute ones are kept."""
    config = load_config(write(tmp_path), env={})
    assert config.supervisor.state_dir == tmp_path / "state"
    assert config.supervisor.log_dir == Path("/var/log/sup")


def test_config_is_frozen(tmp_path: Path) -> None:
    """Assigning to a loaded config raises."""
    config = load_config(write(tmp_path), env={})
    with pytest.raises(ValidationError):
        config.supervisor.tick_s = 1.0  # type: ignore[misc]


@pytest.mark.parametrize(
    ("args", "port", "tp", "dp", "pp"),
    [
        ('"--model-path", "m"', 30000, 1, 1, 1),
        ('"--model-path", "m", "--port", "31000", "--tp", "2"', 31000, 2, 1, 1),
        ('"--model-path=m", "--port=31001", "--tensor-parallel-size=4", "--dp-size", "2"', 31001, 4, 2, 1),
        (
            '"--model", "m", "--tp-size", "2", "--pipeline-parallel-size", "2", "--data-parallel-size", "1"',
            30000,
            2,
            1,
            2,
        ),
        ('"--model-path", "m", "--port", "1", "--port", "31002", "--pp-size", "2"', 31002, 1, 1, 2),
    ],
)
def test_derived_port_and_parallel_sizes(
    tmp_path: Path, args: str, port: int, tp: int, dp: int, pp: int
) -> None:
    """HTTP port and tp/dp/pp come from args in both spellings and all aliases; the last occurrence wins."""
    server = load_config(write(tmp_path, args=args), env={}).servers[0]
    assert (server.http_port, server.tp_size, server.dp_size, server.pp_size) == (port, tp, dp, pp)
    assert server.model_path == "m"


def test_device_paths_default_to_dev_nvidia(tmp_path: Path) -> None:
    """Without gpu_device_paths a server owns /dev/nvidia{N} for each of its GPUs."""
    server = load_config(write(tmp_path), env={}).servers[0]
    assert server.device_paths == (Path("/dev/nvidia0"),)
    assert server.argv[:3] == ("python", "-m", "sglang.launch_server")


def test_env_override_sets_nested_field(tmp_path: Path) -> None:
    """SGLSUP_SUPERVISOR__HTTP__PORT=9500 overrides [supervisor.http] port, typed as TOML."""
    config = load_config(write(tmp_path), env={"SGLSUP_SUPERVISOR__HTTP__PORT": "9500"})
    assert config.supervisor.http.port == 9500


def test_env_override_addresses_servers_by_index_and_name(tmp_path: Path) -> None:
    """A [[servers]] element is addressed by its index or its name; lists parse as TOML arrays."""
    env = {
        "SGLSUP_SERVERS__0__PROBES__HEALTH_TIMEOUT_S": "40",
        "SGLSUP_SERVERS__MAIN__GPUS": "[2, 3]",
        "SGLSUP_SUPERVISOR__STATE_DIR": "/srv/state",
        "SGLSUP_WEBHOOK_URL": "not an override",
    }
    config = load_config(write(tmp_path), env=env)
    assert config.servers[0].probes.health_timeout_s == 40
    assert config.servers[0].gpus == (2, 3)
    assert config.supervisor.state_dir == Path("/srv/state")


def test_env_override_errors_name_the_variable(tmp_path: Path) -> None:
    """An override of an unknown key or a missing server fails with a path naming the problem."""
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path), env={"SGLSUP_SERVERS__7__GPUS": "[1]"})
    assert info.value.errors[0].path == "env SGLSUP_SERVERS__7__GPUS"
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path), env={"SGLSUP_SUPERVISOR__HTTP__PROT": "1"})
    assert info.value.errors[0].path == "supervisor.http.prot"


def test_lower_sglang_health_timeout_allows_shorter_probe(tmp_path: Path) -> None:
    """health_timeout_s may be below 20 s when the server's env lowers SGLANG_HEALTH_CHECK_TIMEOUT."""
    extra = '[servers.env]\nSGLANG_HEALTH_CHECK_TIMEOUT = "5"\n[servers.probes]\nhealth_timeout_s = 8\n'
    server = load_config(write(tmp_path, extra=extra), env={}).servers[0]
    assert server.sglang_health_timeout_s == 5


def test_env_values_are_redacted_in_errors(tmp_path: Path) -> None:
    """A bad value under a server's env is not echoed (it may be a secret)."""
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, extra="[servers.env]\nHF_TOKEN = 12345\n"), env={})
    assert "12345" not in info.value.format_errors()
    assert info.value.errors[0].path == "servers[0].env.HF_TOKEN"


def test_unreadable_or_invalid_toml_is_a_config_error(tmp_path: Path) -> None:
    """A missing file or broken TOML is reported as a ConfigError naming the file."""
    bad = tmp_path / "bad.toml"
    bad.write_text("[supervisor\n")
    for path in (bad, tmp_path / "absent.toml"):
        with pytest.raises(ConfigError) as info:
            load_config(path, env={})
        assert info.value.errors[0].path == str(path)


def test_expected_parsers_resolution(tmp_path: Path) -> None:
    """'auto' takes the model family's parsers, 'none' means unset, a name is used as is."""
    auto = load_config(write(tmp_path), env={}).servers[0]
    assert auto.expected_parsers() == ("qwen", "qwen3")
    extra = '[servers.probes]\nexpected_tool_parser = "hermes"\nexpected_reasoning_parser = "none"\n'
    explicit = load_config(write(tmp_path, extra=extra), env={}).servers[0]
    assert explicit.expected_parsers() == ("hermes", None)
    unknown = load_config(write(tmp_path, args='"--model-path", "/models/mystery"'), env={}).servers[0]
    assert unknown.expected_parsers() is None


def test_ladder_override_replaces_only_its_key(tmp_path: Path) -> None:
    """A ladders override replaces that fault kind's ladder; the other defaults stay."""
    extra = '[servers.policy]\nladders = { oom = [["set --max-running-requests 64"]] }\n'
    ladders = load_config(write(tmp_path, extra=extra), env={}).servers[0].ladders
    assert [str(r) for r in ladders["oom"]] == ["set --max-running-requests 64"]
    assert str(ladders["collective_hang"][0]) == "add --disable-overlap-schedule"


def test_secret_file_sinks_are_checked_to_exist(tmp_path: Path) -> None:
    """A webhook url_file that exists passes; both file and env at once is an error."""
    (tmp_path / "url").write_text("https://x\n")
    ok = write(tmp_path).read_text() + '\n[alerts.webhook]\nurl_file = "url"\n'
    (tmp_path / "ok.toml").write_text(ok)
    assert load_config(tmp_path / "ok.toml", env={}).alerts.webhook is not None
    (tmp_path / "both.toml").write_text(ok + 'url_env = "U"\n')
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / "both.toml", env={"U": "x"})
    assert [e.path for e in info.value.errors] == ["alerts.webhook.url_env"]


def test_args_are_read_as_sglang_reads_them(tmp_path: Path) -> None:
    """Abbreviations and aliases count; a switch right after `--port` leaves it without a value: an error."""
    args = '"--model", "m", "--port", "31000", "--port=31002", "--mem-frac", "0.8", "--enable-dp-attention"'
    server = load_config(write(tmp_path, args=args), env={}).servers[0]
    assert (server.model_path, server.http_port, server.arg("--mem-fraction-static")) == ("m", 31002, "0.8")
    bad = write(tmp_path, args='"--model-path", "m", "--port", "--enable-metrics"')
    with pytest.raises(ConfigError) as info:
        load_config(bad, env={})
    assert [(e.path, e.value, e.allowed) for e in info.value.errors] == [
        ("servers[0].args", "", "--port takes a positive integer")
    ]
