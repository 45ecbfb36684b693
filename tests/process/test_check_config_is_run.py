"""What `check-config` accepts, `run` starts; what `run` cannot build, both refuse with exit 78 and the field path."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.wait import wait_for

ROOT = Path(__file__).resolve().parents[2]
EX_CONFIG = 78
BASE = f"""
[supervisor]
state_dir = "state"
log_dir = "log"
shm_dir = "shm"
gpu_backend = "none"
[supervisor.http]
port = 0
[[servers]]
name = "a"
command = ["{sys.executable}", "-m", "no_such_module_for_sglang"]
args = ["--model-path", "m"]
"""
GROUPED = BASE.replace(
    'args = ["--model-path", "m"]',
    'args = ["--model-path", "m", "--nnodes", "2", "--node-rank", "0", "--dist-init-addr", "127.0.0.1:5000"]',
)


def cli() -> list[str]:
    """The installed console script (the module when no script sits beside the interpreter)."""
    script = Path(sys.executable).with_name("sglang-supervisor")
    return [str(script)] if script.exists() else [sys.executable, "-m", "supervisor.cli"]


def private(path: Path, text: str) -> Path:
    """A secret file only its owner reads."""
    path.write_text(text)
    path.chmod(0o600)
    return path


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "sup.toml"
    path.write_text(text)
    return path


def command(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*cli(), *args], cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_a_webhook_without_its_optional_secret_runs(tmp_path: Path) -> None:
    """Regression: a webhook without an HMAC secret passed check-config, then `run` died with a traceback."""
    private(tmp_path / "url", "http://127.0.0.1:9/hook\n")
    path = write(tmp_path, BASE + '[alerts.webhook]\nurl_file = "url"\n')
    checked = command("check-config", "--config", str(path))
    assert checked.returncode == 0, checked.stderr
    log = tmp_path / "daemon.log"
    with log.open("w") as out:
        daemon = subprocess.Popen(
            [*cli(), "run", "--config", str(path)], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT
        )
        try:
            wait_for(
                lambda: "daemon.started" in log.read_text() or daemon.poll() is not None, 60, "the daemon up"
            )
            assert daemon.poll() is None, log.read_text()
        finally:
            if daemon.poll() is None:
                os.kill(daemon.pid, signal.SIGTERM)
            code = daemon.wait(timeout=60)
    assert code == 0, log.read_text()
    assert "Traceback" not in log.read_text()


def _empty_webhook_url(tmp_path: Path) -> str:
    private(tmp_path / "url", "\n")
    return BASE + '[alerts.webhook]\nurl_file = "url"\n'


def _empty_token(tmp_path: Path) -> str:
    private(tmp_path / "token", "")
    return BASE.replace("port = 0", 'port = 0\ntoken_file = "token"')


def _foreign_address(tmp_path: Path) -> str:
    return BASE.replace("port = 0", 'port = 0\nhost = "192.0.2.1"\nallow_public_without_token = true')


def _unreadable_etcd_ca(tmp_path: Path) -> str:
    (tmp_path / "ca.pem").write_text("not a certificate\n")
    group = (
        '[group]\nname = "g"\nserver = "a"\nnode_rank = 0\nnnodes = 2\n'
        '[group.etcd]\nendpoints = ["https://127.0.0.1:2379"]\nca_file = "ca.pem"\n'
    )
    return GROUPED + group


def _state_dir_a_file(tmp_path: Path) -> str:
    (tmp_path / "state").write_text("")
    return BASE


def _invalid_value(tmp_path: Path) -> str:
    return BASE.replace("port = 0", "port = -1")


CASES: dict[str, tuple[Callable[[Path], str], str]] = {
    "empty webhook url file": (_empty_webhook_url, "alerts.webhook.url_file"),
    "empty control token file": (_empty_token, "supervisor.http.token_file"),
    "address not of this host": (_foreign_address, "supervisor.http.host"),
    "etcd CA file not a certificate": (_unreadable_etcd_ca, "group.etcd.ca_file"),
    "state_dir is a file": (_state_dir_a_file, "supervisor.state_dir"),
    "value out of range": (_invalid_value, "supervisor.http.port"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_config_run_cannot_build_exits_78_in_both_commands(tmp_path: Path, case: str) -> None:
    """check-config and run both refuse it with exit 78 (no systemd restart) and the field path, no traceback."""
    make, field = CASES[case]
    path = write(tmp_path, make(tmp_path))
    for cmd in ("check-config", "run"):
        done = command(cmd, "--config", str(path))
        assert done.returncode == EX_CONFIG, (cmd, done.stdout, done.stderr)
        assert field in done.stderr, (cmd, done.stderr)
        assert "Traceback" not in done.stderr, (cmd, done.stderr)
