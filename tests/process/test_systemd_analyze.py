"""systemd/sglang-supervisor.service is accepted by the real `systemd-analyze` (verify, offline security score)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.paths import REPO

UNIT = REPO / "systemd" / "sglang-supervisor.service"
BINARY = "/opt/sglang-supervisor/venv/bin/sglang-supervisor"
SYSTEMD_ANALYZE = shutil.which("systemd-analyze")
needs_systemd_analyze = pytest.mark.skipif(SYSTEMD_ANALYZE is None, reason="systemd-analyze is not installed")


def verify(tmp_path: Path, text: str) -> subprocess.CompletedProcess[str]:
    """Run `systemd-analyze verify` on `text` installed as sglang-supervisor.service in tmp_path."""
    assert SYSTEMD_ANALYZE is not None
    unit = tmp_path / "sglang-supervisor.service"
    unit.write_text(text)
    return subprocess.run(
        [SYSTEMD_ANALYZE, "verify", "--man=no", "--recursive-errors=no", str(unit)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def with_existing_binary() -> str:
    """The unit with the supervisor's path replaced by an executable that exists here; nothing else changed."""
    true = shutil.which("true")
    assert true is not None
    return UNIT.read_text().replace(BINARY, true)


@needs_systemd_analyze
def test_systemd_analyze_verify_passes(tmp_path: Path) -> None:
    """`systemd-analyze verify` accepts the unit without a single warning."""
    result = verify(tmp_path, with_existing_binary())
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip() == "", result.stderr


@needs_systemd_analyze
def test_systemd_analyze_verify_catches_unknown_keys(tmp_path: Path) -> None:
    """The check has teeth: an unknown directive makes verify fail."""
    result = verify(
        tmp_path, with_existing_binary().replace("KillMode=process", "KillMode=process\nKilMode=x")
    )
    assert result.returncode != 0
    assert "Unknown key 'KilMode'" in result.stderr


@needs_systemd_analyze
def test_offline_security_exposure_stays_below_threshold(tmp_path: Path) -> None:
    """`systemd-analyze security --offline` scores the hardened unit at or below 7.0 (6.8 now; GPU access, ptrace and the network cost the rest)."""
    assert SYSTEMD_ANALYZE is not None
    unit = tmp_path / "sglang-supervisor.service"
    unit.write_text(with_existing_binary())
    result = subprocess.run(
        [SYSTEMD_ANALYZE, "security", "--offline=yes", "--threshold=70", "--no-pager", str(unit)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr
