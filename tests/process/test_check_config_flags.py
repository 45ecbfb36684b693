"""`check-config` asks the target's own `--help` which flags exist."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from supervisor.cli import main

ROOT = Path(__file__).resolve().parents[2]


def _config(tmp_path: Path, extra: list[str]) -> Path:
    text = (ROOT / "examples" / "simulator.toml").read_text()
    text = text.replace('command = ["python", "-m"', f'command = ["{sys.executable}", "-m"')
    text = text.replace(
        '"--enable-metrics",', '"--enable-metrics", ' + ", ".join(f'"{a}"' for a in extra) + ","
    )
    text = text.replace("/tmp/sglang-supervisor/state", str(tmp_path / "state"))
    path = tmp_path / "config.toml"
    path.write_text(text)
    return path


def test_check_config_reports_a_launch_flag_the_target_rejects(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--cuda-graph-max-bs` (ambiguous in SGLang 0.5.23) is reported with its field, exit 78; a clean one passes."""
    assert main(["check-config", "--config", str(_config(tmp_path, ["--cuda-graph-max-bs", "8"]))]) == 78
    assert "servers[0].args: --cuda-graph-max-bs is not accepted" in capsys.readouterr().err
    assert (
        main(["check-config", "--config", str(_config(tmp_path, ["--cuda-graph-max-bs-decode", "8"]))]) == 0
    )


def test_check_config_warns_what_missing_parsers_cost_at_the_first_launch(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Kimi-K2.5 without its parsers: ok (exit 0), with a warning naming the flag and what the daemon does."""
    path = _config(tmp_path, ["--log-level", "info"])
    path.write_text(
        path.read_text()
        .replace('"--tool-call-parser", "kimi_k2",', "")
        .replace('"--reasoning-parser", "kimi_k2",', "")
    )
    assert main(["check-config", "--config", str(path)]) == 0
    err = capsys.readouterr().err
    assert (
        "warning: servers[0].args (sim): --tool-call-parser is unset; the model family needs kimi_k2" in err
    )
    assert "launches with the family's parsers instead" in err
