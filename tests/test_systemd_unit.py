"""systemd/sglang-supervisor.service and .env: accepted by the real systemd-analyze, with the promised settings."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

SYSTEMD = Path(__file__).resolve().parent.parent / "systemd"
UNIT = SYSTEMD / "sglang-supervisor.service"
ENV_FILE = SYSTEMD / "sglang-supervisor.env"
BINARY = "/opt/sglang-supervisor/venv/bin/sglang-supervisor"
SYSTEMD_ANALYZE = shutil.which("systemd-analyze")
needs_systemd_analyze = pytest.mark.skipif(SYSTEMD_ANALYZE is None, reason="systemd-analyze is not installed")


def directives() -> list[tuple[str, str, str]]:
    """(section, key, value) of every directive of the unit, in order."""
    section, found = "", []
    for raw in UNIT.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        found.append((section, key, value))
    return found


def values(key: str) -> list[str]:
    """Every value given to `key` in [Service]."""
    return [v for s, k, v in directives() if s == "Service" and k == key]


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


@pytest.mark.process
@needs_systemd_analyze
def test_systemd_analyze_verify_passes(tmp_path: Path) -> None:
    """`systemd-analyze verify` accepts the unit without a single warning."""
    result = verify(tmp_path, with_existing_binary())
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip() == "", result.stderr


@pytest.mark.process
@needs_systemd_analyze
def test_systemd_analyze_verify_catches_unknown_keys(tmp_path: Path) -> None:
    """The check has teeth: an unknown directive makes verify fail."""
    result = verify(tmp_path, with_existing_binary().replace("KillMode=mixed", "KillMode=mixed\nKilMode=x"))
    assert result.returncode != 0
    assert "Unknown key 'KilMode'" in result.stderr


@pytest.mark.process
@needs_systemd_analyze
def test_offline_security_exposure_stays_below_threshold(tmp_path: Path) -> None:
    """`systemd-analyze security --offline` scores the hardened unit at or below 8.0 (GPU access costs)."""
    assert SYSTEMD_ANALYZE is not None
    unit = tmp_path / "sglang-supervisor.service"
    unit.write_text(with_existing_binary())
    result = subprocess.run(
        [SYSTEMD_ANALYZE, "security", "--offline=yes", "--threshold=80", "--no-pager", str(unit)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr


@pytest.mark.unit
def test_service_settings_for_a_gpu_owning_notify_daemon() -> None:
    """Type=notify with watchdog, KillMode=mixed, stop timeout above the drain, restart on failure."""
    single = {
        "Type": "notify",
        "NotifyAccess": "main",
        "WatchdogSec": "30",
        "ExecStart": f"{BINARY} run --config /etc/sglang-supervisor/config.toml",
        "KillMode": "mixed",
        "Restart": "on-failure",
        "NoNewPrivileges": "yes",
        "PrivateTmp": "yes",
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "DevicePolicy": "closed",
        "LimitMEMLOCK": "infinity",
        "UMask": "0027",
    }
    for key, value in single.items():
        assert values(key) == [value], key
    assert values("ExecReload")[-1] == "/bin/kill -HUP $MAINPID"
    assert int(values("TimeoutStopSec")[0]) >= 150
    assert int(values("RestartSec")[0]) >= 5
    assert values("EnvironmentFile") == ["-/etc/sglang-supervisor/sglang-supervisor.env"]
    assert "/var/lib/sglang-supervisor" in values("ReadWritePaths")[0].split()
    allowed = set(values("DeviceAllow"))
    assert {"char-nvidia* rw", "/dev/nvidiactl rw", "/dev/nvidia-uvm rw"} <= allowed


@pytest.mark.unit
def test_no_setting_that_hides_gpus_shm_or_blocks_ptrace() -> None:
    """No PrivateDevices, MemoryDenyWriteExecute, syscall/capability filters, ProtectProc or PrivateIPC."""
    forbidden = {
        "PrivateDevices",
        "MemoryDenyWriteExecute",
        "SystemCallFilter",
        "CapabilityBoundingSet",
        "ProtectProc",
        "ProcSubset",
        "PrivateIPC",
        "RestrictAddressFamilies",
        "InaccessiblePaths",
    }
    assert forbidden.isdisjoint({k for _, k, _ in directives()})


@pytest.mark.unit
def test_env_file_is_plain_assignments_without_secrets_or_sglang_names() -> None:
    """Each line of the env file is VAR=value; no SGLANG_* variable and nothing secret-looking."""
    names = []
    for line in ENV_FILE.read_text().splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        match = re.fullmatch(r"([A-Z_][A-Z0-9_]*)=(\S*)", line)
        assert match, line
        names.append(match.group(1))
    assert "PYTHONUNBUFFERED" in names
    assert not [n for n in names if n.startswith("SGLANG_")]
    assert not [n for n in names if re.search(r"SECRET|TOKEN|KEY|PASSWORD|WEBHOOK", n)]
