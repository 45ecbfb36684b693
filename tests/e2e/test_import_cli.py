"""The installed `sglang-supervisor import` writes a config that the installed `check-config` accepts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

UNITS = Path(__file__).resolve().parents[1] / "data" / "units"
CLI = str(Path(sys.executable).with_name("sglang-supervisor"))
# SGLang's interpreter and module on a GPU host → the simulator in this venv (real SGLang is not installed here).
REAL = "/root/ml-env/bin/python3 -m sglang.launch_server"
SIMULATED = f"{sys.executable} -m simulator.launch_server"


def state_env(tmp_path: Path) -> dict[str, str]:
    """The environment with the daemon's state and log directories under `tmp_path`."""
    return {
        **os.environ,
        "SGLSUP_SUPERVISOR__STATE_DIR": str(tmp_path / "state"),
        "SGLSUP_SUPERVISOR__LOG_DIR": str(tmp_path / "log"),
    }


def cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """The installed CLI run with `args`, its output captured."""
    return subprocess.run([CLI, *args], capture_output=True, text=True, env=env, timeout=120)


def test_imported_kimi_unit_passes_check_config(tmp_path: Path) -> None:
    """The Kimi-K2.5 EAGLE-3 unit, pointed at the simulator: `import -o` exits 0 and `check-config` accepts the file."""
    text = (UNITS / "kimi-k25-eagle3.service").read_text()
    assert REAL in text
    unit = tmp_path / "sglang-kimi.service"
    unit.write_text(text.replace(REAL, SIMULATED))
    config = tmp_path / "config.toml"
    env = state_env(tmp_path)
    imported = cli("import", str(unit), "-o", str(config), env=env)
    assert imported.returncode == 0, imported.stderr
    assert imported.stdout == "" and "server kimi (unified)" in imported.stderr
    assert "next: sudo -u sglang sglang-supervisor check-config" in imported.stderr
    server = tomllib.loads(config.read_text())["servers"][0]
    assert server["command"] == [sys.executable, "-m", "simulator.launch_server"]
    checked = cli("check-config", "--config", str(config), env=env)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "ok (1 server(s): kimi)" in checked.stdout
    assert "parsers" not in checked.stderr, "the imported args already carry the family's parsers"
    again = cli("import", str(unit), "-o", str(config), env=env)
    assert again.returncode == 1 and "--force" in again.stderr


def test_imported_docker_unit_passes_check_config_and_a_docker_command_is_refused(tmp_path: Path) -> None:
    """A docker unit whose container runs the simulator: `import -o` exits 0 with the command inside the
    container and the supervisor's run in the image on stderr; `check-config` accepts the file, and refuses the
    same config with `command = ["/usr/bin/docker", …]` (exit 78, the field path and the reason on stderr)."""
    text = (UNITS / "containers" / "sglang-docker.service").read_text()
    inside = "python3 -m sglang.launch_server"
    assert inside in text
    unit = tmp_path / "sglang-llama.service"
    unit.write_text(text.replace(inside, SIMULATED))
    config = tmp_path / "config.toml"
    env = state_env(tmp_path)
    imported = cli("import", str(unit), "-o", str(config), env=env)
    assert imported.returncode == 0, imported.stderr
    assert "run the supervisor inside the image" in imported.stderr
    assert "--stop-timeout 180" in imported.stderr and "hf_0123456789abcdefghij" not in imported.stderr
    server = tomllib.loads(config.read_text())["servers"][0]
    assert server["command"] == [sys.executable, "-m", "simulator.launch_server"]
    checked = cli("check-config", "--config", str(config), env=env)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "ok (1 server(s): llama)" in checked.stdout
    client = '["/usr/bin/docker", "run", "--gpus", "all", "lmsysorg/sglang:v0.5.3-cu126", "python3"]'
    config.write_text(
        config.read_text().replace(f"command = {json.dumps(server['command'])}", f"command = {client}")
    )
    assert "/usr/bin/docker" in config.read_text()
    refused = cli("check-config", "--config", str(config), env=env)
    assert refused.returncode == 78, refused.stdout + refused.stderr
    assert "servers[0].command (llama): got '/usr/bin/docker'" in refused.stderr
    assert "not the container" in refused.stderr and "runbook.md#running-in-a-container" in refused.stderr
