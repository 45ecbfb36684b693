"""The installed `sglang-supervisor import` writes a config that the installed `check-config` accepts."""

from __future__ import annotations

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


def test_imported_kimi_unit_passes_check_config(tmp_path: Path) -> None:
    """The Kimi-K2.5 EAGLE-3 unit, pointed at the simulator: `import -o` exits 0 and `check-config` accepts the file."""
    text = (UNITS / "kimi-k25-eagle3.service").read_text()
    assert REAL in text
    unit = tmp_path / "sglang-kimi.service"
    unit.write_text(text.replace(REAL, SIMULATED))
    config = tmp_path / "config.toml"
    env = {
        **os.environ,
        "SGLSUP_SUPERVISOR__STATE_DIR": str(tmp_path / "state"),
        "SGLSUP_SUPERVISOR__LOG_DIR": str(tmp_path / "log"),
    }
    imported = subprocess.run(
        [CLI, "import", str(unit), "-o", str(config)], capture_output=True, text=True, env=env, timeout=60
    )
    assert imported.returncode == 0, imported.stderr
    assert imported.stdout == "" and "server kimi (unified)" in imported.stderr
    assert "next: sudo -u sglang sglang-supervisor check-config" in imported.stderr
    server = tomllib.loads(config.read_text())["servers"][0]
    assert server["command"] == [sys.executable, "-m", "simulator.launch_server"]
    checked = subprocess.run(
        [CLI, "check-config", "--config", str(config)], capture_output=True, text=True, env=env, timeout=120
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "ok (1 server(s): kimi)" in checked.stdout
    assert "parsers" not in checked.stderr, "the imported args already carry the family's parsers"
    again = subprocess.run(
        [CLI, "import", str(unit), "-o", str(config)], capture_output=True, text=True, env=env
    )
    assert again.returncode == 1 and "--force" in again.stderr
