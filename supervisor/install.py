"""`sglang-supervisor install-unit` and `sglang-supervisor files`: put the packaged files where they belong.

Both follow one rule per file (`place`): a missing file is written, an identical one is left alone, and one
that differs (an operator's edit, or an older release) is never replaced silently: the command refuses, shows
the difference and exits 1, unless `--force`, which keeps the old file as `<name>.bak`. Running either twice
changes nothing the second time.
"""

from __future__ import annotations

import difflib
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from supervisor import packaged

# The paths the packaged unit is written with; `render_unit` puts this venv's in their place.
TEMPLATE_EXECUTABLE = "/opt/sglang-supervisor/venv/bin/sglang-supervisor"
TEMPLATE_RUNBOOK = "file:///opt/sglang-supervisor/runbook.md"
UNIT_DIR = Path("etc/systemd/system")
ENV_DIR = Path("etc/sglang-supervisor")
# ProtectHome=yes in the unit makes these invisible to the service.
_HIDDEN_BY_PROTECT_HOME = (Path("/home"), Path("/root"), Path("/run/user"))
_DIFF_LINES = 40


@dataclass(frozen=True)
class Placed:
    """What `place` did (or would do) with one file."""

    dest: Path
    action: str  # "written", "unchanged", "replaced", "refused", "failed"
    note: str = ""

    @property
    def ok(self) -> bool:
        return self.action not in ("refused", "failed")


def executable() -> Path:
    """This venv's `sglang-supervisor` script (beside the running interpreter, the venv's bin/)."""
    return Path(sys.executable).parent / "sglang-supervisor"


def hidden_by_protect_home(exe: Path) -> bool:
    """Whether the unit's ProtectHome=yes hides `exe` from the service (a venv under a home directory)."""
    return any(exe.is_relative_to(hidden) for hidden in _HIDDEN_BY_PROTECT_HOME)


def render_unit(exe: Path) -> str:
    """The packaged unit with `exe` in ExecStart/ExecReload and the packaged runbook in Documentation=."""
    text = (packaged.path("unit") / packaged.UNIT_NAME).read_text()
    return text.replace(TEMPLATE_EXECUTABLE, str(exe)).replace(TEMPLATE_RUNBOOK, packaged.runbook_url())


def place(data: bytes, dest: Path, *, force: bool, dry_run: bool) -> Placed:
    """Write `data` to `dest` unless it is there already; an edited `dest` only with `force` (kept as .bak)."""
    try:
        return _place(data, dest, force=force, dry_run=dry_run)
    except OSError as exc:
        return Placed(dest, "failed", exc.strerror or str(exc))


def _place(data: bytes, dest: Path, *, force: bool, dry_run: bool) -> Placed:
    try:
        current = dest.read_bytes()
    except FileNotFoundError:
        current = None
    if current == data:
        return Placed(dest, "unchanged")
    if current is not None and not force:
        return Placed(dest, "refused", _diff(current, data, dest))
    if dry_run:
        return Placed(dest, "written" if current is None else "replaced", "dry run: nothing written")
    dest.parent.mkdir(parents=True, exist_ok=True)
    backup = dest.with_name(dest.name + ".bak")
    if current is not None:
        _atomic_write(backup, current)
    _atomic_write(dest, data)
    return Placed(
        dest, "written" if current is None else "replaced", f"old copy: {backup}" if current else ""
    )


def _atomic_write(dest: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", dir=dest.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, dest)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _diff(current: bytes, packaged_data: bytes, dest: Path) -> str:
    lines = list(
        difflib.unified_diff(
            current.decode(errors="replace").splitlines(),
            packaged_data.decode(errors="replace").splitlines(),
            fromfile=str(dest),
            tofile="packaged",
            lineterm="",
        )
    )
    more = f"\n... {len(lines) - _DIFF_LINES} more lines" if len(lines) > _DIFF_LINES else ""
    return "\n".join(lines[:_DIFF_LINES]) + more


def report(results: list[Placed], dry_run: bool) -> int:
    """Print one line per file (and the difference of a refused one); 1 if any was refused."""
    verbs = {"written": "would write", "replaced": "would replace"} if dry_run else {}
    for r in results:
        line = f"{verbs.get(r.action, r.action)}: {r.dest}"
        if r.action == "failed":
            print(f"cannot write {r.dest}: {r.note}", file=sys.stderr)
        elif r.action == "refused":
            print(f"{line} differs from the packaged copy (edited?); left as it is.", file=sys.stderr)
            print(r.note, file=sys.stderr)
            print("  --force replaces it and keeps the old one as .bak", file=sys.stderr)
        else:
            print(line + (f" ({r.note})" if r.note else ""))
    return 0 if all(r.ok for r in results) else 1


def install_unit(prefix: Path, *, dry_run: bool, force: bool, exe: Path | None = None) -> int:
    """Install the unit (for this venv's executable) and its env file under `prefix` (`/` on a host)."""
    exe = exe or executable()
    if not exe.exists():
        print(f"no {exe}: install sglang-supervisor into this venv first", file=sys.stderr)
        return 1
    if hidden_by_protect_home(exe):
        print(
            f"warning: {exe} is under a home directory, which the unit's ProtectHome=yes hides from the "
            "service; install into a venv outside it (e.g. /opt/sglang-supervisor/venv)",
            file=sys.stderr,
        )
    env = (packaged.path("unit") / packaged.ENV_NAME).read_bytes()
    results = [
        place(
            render_unit(exe).encode(), prefix / UNIT_DIR / packaged.UNIT_NAME, force=force, dry_run=dry_run
        ),
        place(env, prefix / ENV_DIR / packaged.ENV_NAME, force=force, dry_run=dry_run),
    ]
    code = report(results, dry_run)
    if code == 0 and not dry_run:
        config = Path("/") / ENV_DIR / "config.toml"
        print(f"next: write {config} (examples: {exe} files examples DIR), then")
        print(f"  {exe} check-config --config {config}")
        print("  systemctl daemon-reload && systemctl enable --now sglang-supervisor")
    return code


def copy_files(kind: str, dest_dir: Path | None, *, force: bool) -> int:
    """Print where the packaged `kind` is, or copy its files into `dest_dir`."""
    if dest_dir is None:
        print(packaged.path(kind))
        return 0
    results = [
        place(src.read_bytes(), dest_dir / src.name, force=force, dry_run=False)
        for src in packaged.files(kind)
    ]
    return report(results, dry_run=False)
