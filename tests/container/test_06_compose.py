"""`examples/compose.yaml` checked by a real Compose implementation (Debian's docker-compose 1.29: `config`
validates a file against the Compose schema without an engine), and by `check-config --compose` of the installed
wheel against `examples/container.toml`: no warning for the shipped pair; a grace period below the stop budget
named with its field path."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.container.engines import ensure_packages
from tests.support.paths import REPO
from tests.support.tools import CACHE
from tests.support.wheel import Installed

EXAMPLES = REPO / "examples"


@pytest.fixture(scope="module")
def compose() -> str:
    why = ensure_packages(CACHE / "engines.lock")
    if why is not None:
        pytest.skip(why)
    return "/usr/bin/docker-compose"


def run(argv: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False, **kw)  # type: ignore[call-overload]


def test_a_compose_implementation_accepts_the_shipped_file_and_refuses_a_misspelt_field(
    compose: str, tmp_path: Path
) -> None:
    good = run([compose, "-f", str(EXAMPLES / "compose.yaml"), "config"], cwd=tmp_path)
    assert good.returncode == 0, good.stderr
    assert "stop_grace_period: 3m0s" in good.stdout or "stop_grace_period: 180s" in good.stdout, good.stdout
    typo = tmp_path / "compose.yaml"
    typo.write_text(
        (EXAMPLES / "compose.yaml").read_text().replace("stop_grace_period:", "stop_grace_perod:")
    )
    bad = run([compose, "-f", str(typo), "config", "-q"], cwd=tmp_path)
    assert bad.returncode != 0 and "stop_grace_perod" in bad.stderr


def test_check_config_compose_warns_on_a_grace_period_below_the_stop_budget(
    installed: Installed, tmp_path: Path
) -> None:
    token = tmp_path / "token"
    token.write_text("t\n")
    token.chmod(0o600)
    env = {**installed.env(), "SGLSUP_SUPERVISOR__HTTP__TOKEN_FILE": str(token)}
    cli = [
        str(installed.bin / "sglang-supervisor"),
        "check-config",
        "--config",
        str(EXAMPLES / "container.toml"),
    ]
    good = run([*cli, "--compose", str(EXAMPLES / "compose.yaml")], env=env)
    assert good.returncode == 0, good.stderr
    assert "warning:" not in good.stderr, good.stderr
    short = tmp_path / "compose.yaml"
    short.write_text(
        (EXAMPLES / "compose.yaml").read_text().replace("stop_grace_period: 180s", "stop_grace_period: 30s")
    )
    warned = run([*cli, "--compose", str(short)], env=env)
    assert (
        "warning: services.kimi.stop_grace_period: 30s is shorter than the supervisor's stop budget of 100 s"
    ) in warned.stderr
