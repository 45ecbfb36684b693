"""`[group]`: the member server's --nnodes/--node-rank/--dist-init-addr must agree; files and pairs are checked."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.config import ConfigError, load_config
from tests.support.paths import REPO

ROOT = REPO

DOC = """
[supervisor]
state_dir = "state"
gpu_backend = "none"

[[servers]]
name = "main"
command = ["python", "-m", "sglang.launch_server"]
args = ["--model-path", "m", "--tp-size", "16", {args}]

[servers.probes]
canary_mode = "off"
stream_canary_period_s = 0

[group]
name = "g"
server = "{server}"
node_rank = 1
nnodes = 2
{extra}

[group.etcd]
endpoints = ["http://127.0.0.1:2379"]
{etcd}
"""
GOOD = '"--nnodes", "2", "--node-rank", "1", "--dist-init-addr", "10.0.0.10:5000"'


def load(
    tmp_path: Path, args: str = GOOD, server: str = "main", extra: str = "", etcd: str = ""
) -> ConfigError | None:
    """Load the document; the ConfigError it raised, or None."""
    path = tmp_path / "sup.toml"
    path.write_text(DOC.format(args=args, server=server, extra=extra, etcd=etcd))
    try:
        load_config(path, env={})
    except ConfigError as exc:
        return exc
    return None


def test_the_example_two_node_group_loads() -> None:
    """The shipped 2-node example is valid and names its member server and etcd endpoints."""
    config = load_config(ROOT / "examples" / "group-2node-tp16.toml", env={})
    assert (
        config.group is not None and config.group.server == "dsv3" and len(config.group.etcd.endpoints) == 3
    )
    assert config.group.params().nnodes == 2


def test_a_consistent_group_section_is_accepted(tmp_path: Path) -> None:
    """Args that agree with [group] load without errors."""
    assert load(tmp_path) is None


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        ('"--nnodes", "2", "--node-rank", "0", "--dist-init-addr", "h:5000"', "--node-rank 1"),
        ('"--nnodes", "4", "--node-rank", "1", "--dist-init-addr", "h:5000"', "--nnodes 2"),
        ('"--nnodes", "2", "--node-rank", "1"', "--dist-init-addr HOST:PORT"),
        (
            '"--nnodes", "2", "--node-rank", "1", "--dist-init-addr", "nohostport"',
            "--dist-init-addr HOST:PORT",
        ),
    ],
)
def test_member_args_that_disagree_are_named(tmp_path: Path, args: str, needle: str) -> None:
    """A member server whose multi-node flags disagree with [group] fails at servers[0].args."""
    error = load(tmp_path, args=args)
    assert error is not None and [e.path for e in error.errors] == ["servers[0].args"]
    assert needle in error.format_errors()


def test_group_server_must_name_a_server(tmp_path: Path) -> None:
    """group.server naming no [[servers]] entry is an error at group.server."""
    error = load(tmp_path, server="other")
    assert error is not None and [e.path for e in error.errors] == ["group.server"]


def test_secret_and_tls_files_must_exist_and_come_in_pairs(tmp_path: Path) -> None:
    """A missing password file, and a certificate without its key, are each named; the password never shows."""
    error = load(tmp_path, etcd='username = "sup"\npassword_file = "nope"\ncert_file = "c.pem"')
    assert error is not None
    paths = sorted(e.path for e in error.errors)
    assert paths == ["group.etcd.cert_file", "group.etcd.key_file", "group.etcd.password_file"]


def test_password_is_read_from_its_file_and_not_shown(tmp_path: Path) -> None:
    """The etcd password comes from its file into the client settings, and its repr hides it."""
    (tmp_path / "pw").write_text("hunter2\n")
    path = tmp_path / "sup.toml"
    path.write_text(
        DOC.format(args=GOOD, server="main", extra="", etcd='username = "sup"\npassword_file = "pw"')
    )
    config = load_config(path, env={})
    assert config.group is not None
    settings = config.group.etcd.settings()
    assert settings.password == "hunter2" and "hunter2" not in repr(settings)


def test_a_barrier_timeout_within_one_lease_ttl_is_rejected(tmp_path: Path) -> None:
    """A barrier timeout no longer than the lease TTL (10 s) is named at group.barrier_timeout_s."""
    error = load(tmp_path, extra="barrier_timeout_s = 5", args=GOOD)
    assert error is not None and [e.path for e in error.errors] == ["group.barrier_timeout_s"]


def test_a_node_above_0_must_turn_its_canaries_off(tmp_path: Path) -> None:
    """Node 1 answers only SGLang's dummy /health: canaries left on are named at servers[0].probes."""
    path = tmp_path / "sup.toml"
    doc = DOC.format(args=GOOD, server="main", extra="", etcd="").replace(
        'canary_mode = "off"', 'canary_mode = "require"'
    )
    path.write_text(doc)
    with pytest.raises(ConfigError) as info:
        load_config(path, env={})
    assert [e.path for e in info.value.errors] == ["servers[0].probes"]
