"""The installed commands put each packaged file in place: the unit verifies, the rules pass promtool."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.paths import REPO
from tests.support.tools import ensure_promtool
from tests.support.wheel import Installed

SOURCES = {
    "unit": REPO / "systemd",
    "monitoring": REPO / "monitoring",
    "examples": REPO / "examples",
    "runbook": REPO / "runbook.md",
    "config-reference": REPO / "docs" / "config.md",
}
UNIT = Path("etc/systemd/system/sglang-supervisor.service")
ENV = Path("etc/sglang-supervisor/sglang-supervisor.env")


def cli(installed: Installed, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run the venv's `sglang-supervisor` outside the checkout."""
    return subprocess.run(
        [str(installed.bin / "sglang-supervisor"), *args],
        cwd=cwd,
        env=installed.env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_install_unit_fills_in_the_venv_and_systemd_analyze_verifies_it(
    installed: Installed, tmp_path: Path
) -> None:
    """`install-unit --prefix` writes the unit with this venv's executable; `systemd-analyze verify` is silent."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed")
    dry = cli(installed, tmp_path, "install-unit", "--prefix", str(tmp_path), "--dry-run")
    assert dry.returncode == 0 and "would write" in dry.stdout and not (tmp_path / "etc").exists(), dry
    done = cli(installed, tmp_path, "install-unit", "--prefix", str(tmp_path))
    assert done.returncode == 0, done.stderr
    unit = (tmp_path / UNIT).read_text()
    exe = installed.bin / "sglang-supervisor"
    assert f"ExecStart={exe} run --config /etc/sglang-supervisor/config.toml" in unit
    assert "/opt/sglang-supervisor" not in unit
    runbook = unit.split("Documentation=file://", 1)[1].split("\n", 1)[0]
    assert Path(runbook).read_bytes() == (REPO / "runbook.md").read_bytes()
    assert (tmp_path / ENV).read_bytes() == (REPO / "systemd" / "sglang-supervisor.env").read_bytes()
    result = subprocess.run(
        [analyze, "verify", "--man=no", "--recursive-errors=no", str(tmp_path / UNIT)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0 and result.stderr.strip() == "", result.stderr


def test_install_unit_is_idempotent_and_never_overwrites_an_edit_silently(
    installed: Installed, tmp_path: Path
) -> None:
    """A second run changes nothing; an edited file is refused with a diff, and `--force` keeps it as .bak."""
    assert cli(installed, tmp_path, "install-unit", "--prefix", str(tmp_path)).returncode == 0
    again = cli(installed, tmp_path, "install-unit", "--prefix", str(tmp_path))
    assert again.returncode == 0 and again.stdout.count("unchanged:") == 2, again.stdout
    edited = (tmp_path / UNIT).read_text().replace("WatchdogSec=3\n", "WatchdogSec=60\n")
    (tmp_path / UNIT).write_text(edited)
    refused = cli(installed, tmp_path, "install-unit", "--prefix", str(tmp_path))
    assert refused.returncode == 1 and "--force" in refused.stderr and "+WatchdogSec=3\n" in refused.stderr
    assert (tmp_path / UNIT).read_text() == edited, "a refused file is left as it is"
    forced = cli(installed, tmp_path, "install-unit", "--prefix", str(tmp_path), "--force")
    assert forced.returncode == 0 and "replaced:" in forced.stdout, forced
    assert (tmp_path / UNIT.with_name(UNIT.name + ".bak")).read_text() == edited
    assert "WatchdogSec=3\n" in (tmp_path / UNIT).read_text()


def test_packaged_rules_pass_promtool(installed: Installed, tmp_path: Path) -> None:
    """`files monitoring DIR` copies the bundle; promtool checks the rules (all lints) and runs their tests."""
    copied = cli(installed, tmp_path, "files", "monitoring", str(tmp_path / "monitoring"))
    assert copied.returncode == 0, copied.stderr
    promtool = ensure_promtool()
    rules = tmp_path / "monitoring" / "alerts.yaml"
    check = subprocess.run(
        [str(promtool), "check", "rules", "--lint=all", "--lint-fatal", str(rules)],
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert check.returncode == 0 and b"SUCCESS" in check.stdout, check.stdout + check.stderr
    tests = subprocess.run(
        [str(promtool), "test", "rules", "alerts_test.yaml"],
        cwd=tmp_path / "monitoring",
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert tests.returncode == 0 and b"SUCCESS" in tests.stdout, tests.stdout + tests.stderr


@pytest.mark.parametrize("kind", sorted(SOURCES))
def test_files_prints_the_packaged_path_and_copies_it_once(
    installed: Installed, tmp_path: Path, kind: str
) -> None:
    """`files KIND` prints a path inside the venv holding the repository's files; `files KIND DIR` copies them once."""
    shown = cli(installed, tmp_path, "files", kind)
    where = Path(shown.stdout.strip())
    assert shown.returncode == 0 and where.is_relative_to(installed.venv), shown
    source = SOURCES[kind]
    names = sorted(p.name for p in source.iterdir()) if source.is_dir() else [source.name]
    first = cli(installed, tmp_path, "files", kind, str(tmp_path / "out"))
    assert first.returncode == 0 and first.stdout.count("written:") == len(names), first
    for name in names:
        original = source / name if source.is_dir() else source
        assert (tmp_path / "out" / name).read_bytes() == original.read_bytes(), name
    second = cli(installed, tmp_path, "files", kind, str(tmp_path / "out"))
    assert second.returncode == 0 and second.stdout.count("unchanged:") == len(names), second
