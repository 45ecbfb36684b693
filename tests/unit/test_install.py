"""install-unit and files: the packaged files are found, rendered for this venv and placed once, never over an edit."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor import packaged
from supervisor.cli import main
from supervisor.install import (
    TEMPLATE_EXECUTABLE,
    TEMPLATE_RUNBOOK,
    hidden_by_protect_home,
    place,
    render_unit,
)
from tests.support.paths import REPO


@pytest.mark.parametrize(
    ("kind", "source"),
    [
        ("unit", "systemd"),
        ("monitoring", "monitoring"),
        ("examples", "examples"),
        ("runbook", "runbook.md"),
        ("config-reference", "docs/config.md"),
    ],
)
def test_every_kind_is_found_with_the_repository_files(kind: str, source: str) -> None:
    """packaged.files(kind) holds exactly the repository's files of that kind, byte for byte."""
    want = REPO / source
    originals = sorted(want.iterdir()) if want.is_dir() else [want]
    found = packaged.files(kind)
    assert [p.name for p in found] == [p.name for p in originals]
    assert all(a.read_bytes() == b.read_bytes() for a, b in zip(found, originals, strict=True))


def test_render_unit_names_this_venv_and_the_packaged_runbook() -> None:
    """ExecStart/ExecReload get the given executable, Documentation= the packaged runbook; nothing else changes."""
    exe = Path("/srv/sup/venv/bin/sglang-supervisor")
    text = render_unit(exe)
    template = (REPO / "systemd" / "sglang-supervisor.service").read_text()
    assert TEMPLATE_EXECUTABLE in template and TEMPLATE_RUNBOOK in template
    assert TEMPLATE_EXECUTABLE not in text and TEMPLATE_RUNBOOK not in text
    assert f"ExecStart={exe} run --config /etc/sglang-supervisor/config.toml" in text
    assert f"ExecReload={exe} check-config --config /etc/sglang-supervisor/config.toml" in text
    assert f"Documentation={packaged.runbook_url()}" in text
    assert len(text.splitlines()) == len(template.splitlines())


def test_place_writes_once_and_leaves_an_identical_file_alone(tmp_path: Path) -> None:
    """A missing file is written (0644); the same bytes again is `unchanged` and writes nothing."""
    dest = tmp_path / "a" / "unit"
    assert place(b"x\n", dest, force=False, dry_run=False).action == "written"
    assert dest.read_bytes() == b"x\n" and dest.stat().st_mode & 0o777 == 0o644
    mtime = dest.stat().st_mtime_ns
    assert place(b"x\n", dest, force=False, dry_run=False).action == "unchanged"
    assert dest.stat().st_mtime_ns == mtime


def test_place_refuses_an_edited_file_and_force_keeps_it_as_bak(tmp_path: Path) -> None:
    """Different bytes: refused with a diff and left as is; with force replaced, the edit kept in .bak."""
    dest = tmp_path / "unit"
    dest.write_bytes(b"mine\n")
    refused = place(b"packaged\n", dest, force=False, dry_run=False)
    assert not refused.ok and "-mine" in refused.note and "+packaged" in refused.note
    assert dest.read_bytes() == b"mine\n"
    forced = place(b"packaged\n", dest, force=True, dry_run=False)
    assert forced.action == "replaced" and dest.read_bytes() == b"packaged\n"
    assert (tmp_path / "unit.bak").read_bytes() == b"mine\n"


def test_a_destination_that_cannot_be_written_is_reported_not_raised(tmp_path: Path) -> None:
    """A file where a directory should be (or no permission): `failed` with the reason, no traceback."""
    (tmp_path / "etc").write_text("a file, not a directory")
    result = place(b"x", tmp_path / "etc" / "unit", force=False, dry_run=False)
    assert result.action == "failed" and not result.ok and result.note


def test_dry_run_writes_nothing(tmp_path: Path) -> None:
    """--dry-run says what it would write and leaves the file system alone."""
    dest = tmp_path / "etc" / "unit"
    assert place(b"x", dest, force=False, dry_run=True).action == "written"
    assert not (tmp_path / "etc").exists()


@pytest.mark.parametrize(
    ("exe", "hidden"),
    [
        ("/home/me/.local/pipx/venvs/sglang-supervisor/bin/sglang-supervisor", True),
        ("/root/venv/bin/sglang-supervisor", True),
        ("/opt/sglang-supervisor/venv/bin/sglang-supervisor", False),
        ("/usr/local/bin/sglang-supervisor", False),
    ],
)
def test_a_venv_under_a_home_directory_is_flagged(exe: str, hidden: bool) -> None:
    """install-unit warns about an executable the unit's ProtectHome=yes would hide from the service."""
    assert hidden_by_protect_home(Path(exe)) is hidden


def test_version_flag_prints_the_distribution_version(capsys: pytest.CaptureFixture[str]) -> None:
    """`sglang-supervisor --version` prints the installed distribution's version and exits 0."""
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == f"sglang-supervisor {packaged.version()}"
