"""The product as a user installs it: the sdist and, from it, the wheel, installed without extras into a clean venv.

`python -m build` makes the sdist from the tree and the wheel from the sdist (so both must carry everything);
the wheel goes into a fresh venv (no system site-packages, no extras) with its dependencies resolved from its own
metadata, offline from a wheelhouse that `pip download` filled with exactly those. Everything is cached under
`~/.cache/sglang-supervisor/wheel/`, keyed by a fingerprint of every file the build reads, so it reflects the
current tree and is rebuilt only when one of them changes. A file lock serialises pytest workers and sessions.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from email.parser import Parser
from pathlib import Path

from tests.support.paths import REPO
from tests.support.tools import CACHE, file_lock

ROOT = CACHE / "wheel"
# Every input of the build: the project metadata, the packages and the files they carry as package data.
SOURCES = (
    "pyproject.toml",
    "README.md",
    "supervisor",
    "probes",
    "policies",
    "simulator",
    "systemd",
    "monitoring",
    "examples",
    "runbook.md",
    "docs/config.md",
)
_SKIP_DIRS = {"__pycache__", ".mypy_cache"}
_TIMEOUT_S = 900
_KEEP_S = 24 * 3600  # other trees' builds are pruned after a day unused


@dataclass(frozen=True)
class Installed:
    """The built artifacts and the clean venv the wheel is installed in."""

    sdist: Path
    wheel: Path
    venv: Path
    build_s: float  # seconds this session spent building and installing (0 when all came from the cache)

    @property
    def bin(self) -> Path:
        return self.venv / "bin"

    @property
    def python(self) -> Path:
        return self.bin / "python"

    @property
    def version(self) -> str:
        return self.wheel.name.split("-")[1]

    def env(self) -> dict[str, str]:
        """An environment for the installed commands: nothing of the checkout or the dev venv on the paths."""
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
        env["PATH"] = os.pathsep.join([str(self.bin), "/usr/local/bin", "/usr/bin", "/bin"])
        return env


def fingerprint() -> str:
    """sha256 over the path and bytes of every build input (symlinks by their target)."""
    digest = hashlib.sha256()
    for rel in SOURCES:
        for path in _walk(REPO / rel):
            digest.update(str(path.relative_to(REPO)).encode() + b"\0")
            digest.update(os.readlink(path).encode() if path.is_symlink() else path.read_bytes())
            digest.update(b"\0")
    return digest.hexdigest()[:20]


def _walk(top: Path) -> Iterator[Path]:
    if not top.is_dir() or top.is_symlink():
        yield top
        return
    for dirpath, dirnames, filenames in os.walk(top):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS and not d.endswith(".egg-info"))
        base = Path(dirpath)
        links = [d for d in dirnames if (base / d).is_symlink()]
        for name in sorted([*filenames, *links]):
            if not name.endswith(".pyc"):
                yield base / name


def requirements(wheel: Path) -> list[str]:
    """The wheel's `Requires-Dist` lines that a plain install (no extras) takes."""
    with zipfile.ZipFile(wheel) as zf:
        meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        message = Parser().parsestr(zf.read(meta).decode())
    return sorted(r for r in message.get_all("Requires-Dist") or [] if "extra ==" not in r)


def _run(argv: list[str | Path], what: str, cwd: Path | None = None) -> None:
    result = subprocess.run(
        [str(a) for a in argv], cwd=cwd, capture_output=True, text=True, timeout=_TIMEOUT_S, check=False
    )
    if result.returncode != 0:
        raise RuntimeError(
            f"{what} failed (exit {result.returncode}):\n{(result.stdout + result.stderr)[-3000:]}"
        )


def _locked() -> AbstractContextManager[None]:
    return file_lock(ROOT / "lock")


def wheelhouse(wheel: Path) -> Path:
    """A folder of the wheels of exactly what `wheel` requires, downloaded once per set of requirements."""
    key = hashlib.sha256("\n".join(requirements(wheel)).encode()).hexdigest()[:16]
    house = ROOT / f"wheelhouse-{key}"
    if not house.exists():
        partial = house.with_name(house.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        _run([sys.executable, "-m", "pip", "download", "--quiet", "--dest", partial, wheel], "pip download")
        partial.rename(house)
    return house


def _build(out: Path) -> None:
    """sdist and wheel into out/dist, the wheel into the clean venv out/venv; `complete` marks it done."""
    _run([sys.executable, "-m", "build", "--outdir", out / "dist", REPO], "python -m build")
    wheel = next((out / "dist").glob("*.whl"))
    house = wheelhouse(wheel)
    venv = out / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", venv], "python -m venv")
    # The dev venv's pip installs into the clean one: offline, from the wheelhouse, without extras.
    pip: list[str | Path] = [
        sys.executable,
        "-m",
        "pip",
        "--python",
        venv / "bin" / "python",
        "install",
        "--quiet",
    ]
    _run([*pip, "--no-index", "--find-links", house, wheel], "pip install of the wheel")
    (out / "complete").touch()


def _prune(keep: Path) -> None:
    now = time.time()
    for old in ROOT.glob("tree-*"):
        stamp = old / "complete"
        if old != keep and (not stamp.exists() or now - stamp.stat().st_mtime > _KEEP_S):
            shutil.rmtree(old, ignore_errors=True)


def ensure_installed() -> Installed:
    """The current tree's sdist, wheel and clean venv, built (under the lock) unless already cached."""
    started = time.monotonic()
    out = ROOT / f"tree-{fingerprint()}"
    built = False
    with _locked():
        if not (out / "complete").exists():
            shutil.rmtree(out, ignore_errors=True)
            _build(out)
            built = True
        (out / "complete").touch()
        _prune(out)
    dist = out / "dist"
    return Installed(
        sdist=next(dist.glob("*.tar.gz")),
        wheel=next(dist.glob("*.whl")),
        venv=out / "venv",
        build_s=time.monotonic() - started if built else 0.0,
    )
