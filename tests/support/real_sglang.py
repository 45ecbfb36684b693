"""The real SGLang 0.5.23, installed once into venvs cached outside the clone, for the `real` test tiers.

Two venvs live in `$SGLSUP_CACHE_DIR` (default `$XDG_CACHE_HOME/sglang-supervisor`, else
`~/.cache/sglang-supervisor`): `real-<hash12>/` (the CLI and parsers, keyed by the hash of
`requirements-real.txt`) and `serving-<hash12>/` (the whole server on CPU, keyed by the hash of both
requirements files and the torchvision stand-in): the serving venv holds only the serving extras and the stand-in,
and reaches the CLI set through a `.pth` file naming the `real-` venv's site-packages (1.2 GB instead of 3.7). A marker file is written only once the whole install
succeeded and its smoke import passes, so a half install is redone. An fcntl lock keeps two pytest processes
from installing the same venv at once.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[2]
REQUIREMENTS = _ROOT / "requirements-real.txt"
SERVING_REQUIREMENTS = _ROOT / "requirements-real-serving.txt"
STANDIN = _ROOT / "tests" / "real_serving" / "standin" / "torchvision" / "__init__.py"
STANDIN_VERSION = "0.29.1"
SMOKE_IMPORT = (
    "import argparse; from sglang.srt.server_args import ServerArgs; "
    "ServerArgs.add_cli_args(argparse.ArgumentParser())"
)
SERVING_SMOKE_IMPORT = "import torchvision.transforms; import sglang.srt.entrypoints.http_server"
_MARKER = ".install-complete"
_TAIL_CHARS = 4000
_LOCK_POLL_S = 0.5


class RealSglangError(RuntimeError):
    """The real SGLang venv could not be installed, or a script run with it failed."""


def cache_root() -> Path:
    """Where cached real-SGLang venvs live."""
    explicit = os.environ.get("SGLSUP_CACHE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "sglang-supervisor"


def _digest(files: tuple[Path, ...]) -> str:
    sha = hashlib.sha256()
    for path in files:
        sha.update(path.read_bytes())
    return sha.hexdigest()


def venv_dir(requirements: Path = REQUIREMENTS) -> Path:
    """The venv for this exact requirements file: `real-<first 12 hex of its sha256>`."""
    return cache_root() / f"real-{_digest((requirements,))[:12]}"


def serving_venv_dir() -> Path:
    """The serving venv for these exact requirement files and stand-in: `serving-<hash12>`."""
    return cache_root() / f"serving-{_digest((REQUIREMENTS, SERVING_REQUIREMENTS, STANDIN))[:12]}"


def _tail(text: str) -> str:
    return text[-_TAIL_CHARS:]


def _run(argv: list[str], deadline: float, log: Path) -> None:
    """Run one install step, append its output to `log`, raise with the output's tail on failure."""
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise RealSglangError(f"install of the real SGLang ran out of time before: {' '.join(argv)}")
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=remaining, check=False)
    except subprocess.TimeoutExpired as exc:
        out = exc.output if isinstance(exc.output, str) else ""
        raise RealSglangError(f"timed out after {remaining:.0f} s: {' '.join(argv)}\n{_tail(out)}") from None
    output = done.stdout + done.stderr
    with log.open("a", encoding="utf-8") as sink:
        sink.write(f"$ {' '.join(argv)}\n{output}\n")
    if done.returncode != 0:
        raise RealSglangError(f"exit {done.returncode}: {' '.join(argv)}\n{_tail(output)}")


def _site(venv: Path) -> Path:
    return venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"


def _install_standin(target: Path) -> None:
    """Copy the torchvision stand-in package and its dist-info into the venv's site-packages."""
    site = _site(target)
    package = site / "torchvision"
    package.mkdir(exist_ok=True)
    shutil.copyfile(STANDIN, package / "__init__.py")
    info = site / f"torchvision-{STANDIN_VERSION}.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: torchvision\nVersion: {STANDIN_VERSION}\n")


def _install(
    target: Path, requirements: tuple[Path, ...], smoke: str, deadline: float, base: Path | None
) -> None:
    """Build the venv from scratch: venv (over `base`'s packages), pinned install (retried once), stand-in,
    smoke import, marker."""
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    log = target / "install.log"
    _run([sys.executable, "-m", "venv", str(target)], deadline, log)
    if base is not None:
        (_site(target) / "_sglsup_real_base.pth").write_text(f"{_site(base)}\n")
    python = target / "bin" / "python"
    pip = [str(python), "-m", "pip", "install", "--no-deps", "--no-input"]
    for path in requirements:
        pip += ["-r", str(path)]
    try:
        _run(pip, deadline, log)
    except RealSglangError:
        _run(pip, deadline, log)
    if SERVING_REQUIREMENTS in requirements:
        _install_standin(target)
    _run([str(python), "-c", smoke], deadline, log)
    (target / _MARKER).write_text(target.name + "\n")


def _lock(path: Path, deadline: float) -> int:
    """Take an exclusive fcntl lock on `path`, polling until `deadline`; returns the open descriptor."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() >= deadline:
                os.close(fd)
                raise RealSglangError(f"another process holds {path} (installing the real SGLang)") from None
            time.sleep(_LOCK_POLL_S)


def _cached_python(
    target: Path, requirements: tuple[Path, ...], smoke: str, timeout_s: float, base: Path | None = None
) -> Path:
    """The interpreter of the venv at `target`, installing it first under its lock if needed."""
    deadline = time.monotonic() + timeout_s
    python = target / "bin" / "python"
    if (target / _MARKER).is_file() and python.exists():
        return python
    target.parent.mkdir(parents=True, exist_ok=True)
    fd = _lock(target.parent / f"{target.name}.lock", deadline)
    try:
        if not ((target / _MARKER).is_file() and python.exists()):
            _install(target, requirements, smoke, deadline, base)
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
    return python


def real_sglang_python(timeout_s: float = 1500) -> Path:
    """The interpreter of the cached real-SGLang venv, installing it first if needed (raises RealSglangError)."""
    return _cached_python(venv_dir(), (REQUIREMENTS,), SMOKE_IMPORT, timeout_s)


def real_serving_python(timeout_s: float = 2400) -> Path:
    """The interpreter of the cached serving venv (the whole server on CPU), installing both first if needed."""
    deadline = time.monotonic() + timeout_s
    base = real_sglang_python(timeout_s).parent.parent
    left = max(1.0, deadline - time.monotonic())
    return _cached_python(serving_venv_dir(), (SERVING_REQUIREMENTS,), SERVING_SMOKE_IMPORT, left, base)


# A script importing SGLang (torch and all) alone takes 6-30 s here; beside make test's other tiers on 2 cores it took
# over 300 s twice (a deadline, not a measure).
SCRIPT_TIMEOUT_S = 900.0


def run_real_script(python: Path, script: str, timeout_s: float = SCRIPT_TIMEOUT_S) -> str:
    """Run `python -c script` and return its stdout; raise RealSglangError with stderr's tail on failure."""
    try:
        done = subprocess.run(
            [str(python), "-c", script], capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except subprocess.TimeoutExpired as exc:
        err = exc.stderr if isinstance(exc.stderr, str) else ""
        raise RealSglangError(f"real-SGLang script timed out after {timeout_s} s\n{_tail(err)}") from None
    if done.returncode != 0:
        raise RealSglangError(f"real-SGLang script exited {done.returncode}\n{_tail(done.stderr)}")
    return done.stdout
