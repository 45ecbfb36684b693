"""systemd/sglang-supervisor.service and .env: the settings a GPU-owning notify daemon needs, and no secrets."""

from __future__ import annotations

import re

from tests.support.paths import REPO

SYSTEMD = REPO / "systemd"
UNIT = SYSTEMD / "sglang-supervisor.service"
ENV_FILE = SYSTEMD / "sglang-supervisor.env"
BINARY = "/opt/sglang-supervisor/venv/bin/sglang-supervisor"


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


def test_service_settings_for_a_gpu_owning_notify_daemon() -> None:
    """Type=notify with watchdog, KillMode=process (a dead supervisor's servers are adopted), stop timeout above
    the drain, a quick restart on failure (the tier tests/systemd/ measures the gap) and a start limit."""
    single = {
        "Type": "notify",
        "NotifyAccess": "main",
        "WatchdogSec": "3",
        "ExecStart": f"{BINARY} run --config /etc/sglang-supervisor/config.toml",
        "KillMode": "process",
        "Restart": "on-failure",
        "RestartSec": "500ms",
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
    unit = {k: v for s, k, v in directives() if s == "Unit"}
    assert (unit["StartLimitIntervalSec"], unit["StartLimitBurst"]) == ("2min", "5")
    assert values("EnvironmentFile") == ["-/etc/sglang-supervisor/sglang-supervisor.env"]
    assert "/var/lib/sglang-supervisor" in values("ReadWritePaths")[0].split()
    allowed = set(values("DeviceAllow"))
    assert {"char-nvidia* rw", "/dev/nvidiactl rw", "/dev/nvidia-uvm rw"} <= allowed


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
