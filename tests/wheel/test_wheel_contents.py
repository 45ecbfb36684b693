"""What the wheel and the sdist carry, and what a plain install of the wheel gets."""

from __future__ import annotations

import subprocess
import tarfile
import zipfile
from pathlib import Path

from tests.support.paths import REPO
from tests.support.wheel import Installed, requirements

OPERATOR_FILES = (
    "systemd/sglang-supervisor.service",
    "systemd/sglang-supervisor.env",
    "monitoring/alerts.yaml",
    "monitoring/alerts_test.yaml",
    "monitoring/grafana-dashboard.json",
    "runbook.md",
    *(f"examples/{p.name}" for p in sorted((REPO / "examples").iterdir())),
)
PACKAGED_AS = {"docs/config.md": "config.md"}


def packaged(path: str) -> str:
    """Where a file of the repository sits in the distribution (under supervisor/_share/)."""
    return "supervisor/_share/" + PACKAGED_AS.get(path, path)


def test_wheel_carries_the_operator_files_byte_for_byte(installed: Installed) -> None:
    """`unzip -l` of the wheel lists the unit, env file, monitoring, runbook, config reference and examples."""
    listing = subprocess.run(
        ["unzip", "-l", str(installed.wheel)], capture_output=True, text=True, check=True
    ).stdout
    with zipfile.ZipFile(installed.wheel) as zf:
        for path in (*OPERATOR_FILES, "docs/config.md"):
            assert packaged(path) in listing, path
            assert zf.read(packaged(path)) == (REPO / path).read_bytes(), path
        assert "simulator/launch_server.py" in zf.namelist(), "the demo's simulator ships in the wheel"


def test_sdist_carries_the_same_files(installed: Installed) -> None:
    """The sdist (which the wheel is built from) holds each operator file as a regular file."""
    root = installed.sdist.name.removesuffix(".tar.gz")
    with tarfile.open(installed.sdist) as tf:
        for path in (*OPERATOR_FILES, "docs/config.md"):
            member = tf.getmember(f"{root}/{packaged(path)}")
            assert member.isfile(), path


def test_py_spy_is_a_runtime_dependency_installed_beside_the_daemon(installed: Installed) -> None:
    """A plain install (no extras) requires py-spy and puts it in the venv's bin/, where the probes look."""
    assert any(r.startswith("py-spy") for r in requirements(installed.wheel))
    assert (installed.bin / "py-spy").exists()
    assert (installed.bin / "sglang-supervisor").exists()


def test_installed_version_and_code_come_from_the_venv(installed: Installed, tmp_path: Path) -> None:
    """`--version` prints the wheel's version, and the packages import from the venv, not the checkout."""
    run = {"capture_output": True, "text": True, "check": True, "cwd": tmp_path, "env": installed.env()}
    version = subprocess.run([str(installed.bin / "sglang-supervisor"), "--version"], **run).stdout
    assert version.strip() == f"sglang-supervisor {installed.version}"
    where = subprocess.run(
        [
            str(installed.python),
            "-c",
            "import supervisor, simulator; print(supervisor.__file__, simulator.__file__)",
        ],
        **run,
    ).stdout.split()
    assert all(path.startswith(str(installed.venv)) for path in where), where
