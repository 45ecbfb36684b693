"""Commands that cannot run are config errors; a port held by someone else is named before a launch."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from supervisor.config import load_config
from supervisor.host.preflight import foreign_port_holders, port_holders
from supervisor.host.proctree import RUN_MARKER
from tests.support.wait import wait_for

pytestmark = pytest.mark.hardening

ROOT = Path(__file__).resolve().parents[2]
CONFIG = """
[supervisor]
state_dir = "state"
log_dir = "log"
gpu_backend = "none"
[[servers]]
name = "a"
command = {command}
args = ["--model-path", "Qwen/Qwen3-8B", "--port", "{port}"]
"""


def write(tmp_path: Path, command: list[str], port: int = 30000) -> Path:
    path = tmp_path / "sup.toml"
    quoted = "[" + ", ".join(f'"{c}"' for c in command) + "]"
    path.write_text(CONFIG.format(command=quoted, port=port))
    return path


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "supervisor.cli", *args], cwd=ROOT, capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize("kind", ["missing", "not_executable", "directory", "not_on_path"])
def test_a_command_that_cannot_run_is_a_config_error(tmp_path: Path, kind: str) -> None:
    """check-config and run both exit 78 (no restart by systemd), both naming servers[0].command and why."""
    script = tmp_path / "serve.sh"
    script.write_text("#!/bin/sh\nexit 0\n")
    script.chmod(0o644)
    program = {
        "missing": str(tmp_path / "venv" / "bin" / "python"),
        "not_executable": str(script),
        "directory": str(tmp_path),
        "not_on_path": "no-such-sglang-launcher",
    }[kind]
    path = write(tmp_path, [program, "-m", "sglang.launch_server"])
    checked = cli("check-config", "--config", str(path))
    assert checked.returncode == 78
    assert "servers[0].command (a)" in checked.stderr and program in checked.stderr
    ran = cli("run", "--config", str(path))
    assert ran.returncode == 78 and "servers[0].command (a)" in ran.stderr


def test_an_interpreter_without_the_module_passes_with_a_note(tmp_path: Path) -> None:
    """An existing interpreter that cannot import the target passes check-config, noting flags were not checked."""
    path = write(tmp_path, [sys.executable, "-m", "no_such_module_for_sglang"])
    checked = cli("check-config", "--config", str(path))
    assert checked.returncode == 0, checked.stderr
    assert "flags not checked" in checked.stderr and "No module named" in checked.stderr


@pytest.fixture
def listener(request: pytest.FixtureRequest) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """A process listening on a free loopback port (with our run marker when the test asks for it)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    env = {**os.environ, **({RUN_MARKER: "leftover-run"} if getattr(request, "param", False) else {})}
    code = (
        "import socket, time; s = socket.socket(); "
        f"s.bind(('127.0.0.1', {port})); s.listen(); print('up', flush=True); time.sleep(120)"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"up"
        yield proc, port
    finally:
        proc.kill()
        proc.wait(timeout=10)


def test_a_foreign_port_holder_is_named_before_the_launch(
    tmp_path: Path, listener: tuple[subprocess.Popen[bytes], int]
) -> None:
    """A port the server needs, held by another process, is reported with its pid and name."""
    proc, port = listener
    cfg = load_config(write(tmp_path, [sys.executable], port), env={}).servers[0]
    holders = foreign_port_holders(cfg)
    assert [(h.port, h.pid, h.ours) for h in holders] == [(port, proc.pid, False)]
    assert holders[0].describe().startswith(f"port {port} held by pid {proc.pid} (python")


@pytest.mark.parametrize("listener", [True], indirect=True)
def test_a_leftover_of_our_own_run_is_not_foreign(
    tmp_path: Path, listener: tuple[subprocess.Popen[bytes], int]
) -> None:
    """A holder carrying our run marker is ours (to be reaped), so it is not reported as foreign."""
    proc, port = listener
    cfg = load_config(write(tmp_path, [sys.executable], port), env={}).servers[0]
    assert [h.ours for h in port_holders([port])] == [True]
    assert foreign_port_holders(cfg) == []
    proc.kill()
    proc.wait(timeout=10)
    wait_for(lambda: not port_holders([port]), 10, f"port {port} without holders")
