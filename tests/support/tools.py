"""Real Prometheus tools, etcd and HAProxy for tests, taken out of the Debian packages without installing any
service.

`apt-get download prometheus prometheus-alertmanager etcd-server haproxy` (and HAProxy's libraries) into `~/.cache/sglang-supervisor/debs` (outside the
clone), `dpkg-deb -x` each into the cache (staged, then renamed into place), and return the binary path. A file lock serialises concurrent
pytest processes; a binary already extracted is reused.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from functools import partial
from pathlib import Path

CACHE = Path(os.environ.get("SGLSUP_TOOLS_CACHE", Path.home() / ".cache" / "sglang-supervisor"))
_TIMEOUT_S = 600
_AM_TEMPLATE_DIR = b"/usr/share/prometheus/alertmanager"
_AM_TEMPLATE_DIR_RELATIVE = b"usr//share/prometheus/alertmanager"


@contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive fcntl lock on `path` (its folder made), shared by every pytest worker that installs a thing."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _locked() -> AbstractContextManager[None]:
    return file_lock(CACHE / "tools.lock")


def _run(argv: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=_TIMEOUT_S, check=False)


def _download(package: str) -> Path:
    debs = CACHE / "debs"
    debs.mkdir(parents=True, exist_ok=True)
    found = sorted(debs.glob(f"{package}_*.deb"))
    if found:
        return found[-1]
    result = _run(["apt-get", "download", package], cwd=debs)
    if result.returncode != 0:
        _run(["apt-get", "update"])
        result = _run(["apt-get", "download", package], cwd=debs)
    found = sorted(debs.glob(f"{package}_*.deb"))
    if result.returncode != 0 or not found:
        raise RuntimeError(f"apt-get download {package} failed: {result.stderr.strip()[-500:]}")
    return found[-1]


def _ensure(package: str, binary: str, bindir: str = "usr/bin") -> Path:
    path = CACHE / "root" / package / bindir / binary
    if not path.exists():
        extract(package, lambda root: (root / bindir / binary).exists())
    if not path.exists():
        raise RuntimeError(f"{package} has no {bindir}/{binary}")
    return path


def extract(package: str, done: Callable[[Path], bool]) -> Path:
    """The package extracted into the cache (once: `done(root)` says whether it is there already)."""
    root = CACHE / "root" / package
    with _locked():
        if not done(root):
            deb = _download(package)
            staging = root.with_name(f"{package}.partial")
            shutil.rmtree(staging, ignore_errors=True)
            staging.parent.mkdir(parents=True, exist_ok=True)
            result = _run(["dpkg-deb", "-x", str(deb), str(staging)])
            if result.returncode != 0:
                raise RuntimeError(f"dpkg-deb -x {deb.name} failed: {result.stderr.strip()[-500:]}")
            shutil.rmtree(root, ignore_errors=True)
            staging.rename(root)
    return root


def ensure_promtool() -> Path:
    """Path to `promtool` from the Debian `prometheus` package."""
    return _ensure("prometheus", "promtool")


def ensure_prometheus() -> Path:
    """Path to the Prometheus server from the Debian `prometheus` package (the API needs none of its web assets)."""
    return _ensure("prometheus", "prometheus")


def ensure_alertmanager() -> Path:
    """Path to an Alertmanager binary from the Debian package; run it with `cwd=path.parents[2]`.

    Debian's build reads its default notification template from the fixed directory
    /usr/share/prometheus/alertmanager, which only a package install creates. The returned copy has that
    string replaced, byte for byte, by the same-length relative path `usr//share/prometheus/alertmanager`,
    so it finds the extracted templates when its working directory is the extraction root.
    """
    original = _ensure("prometheus-alertmanager", "prometheus-alertmanager")
    relocated = original.with_name("prometheus-alertmanager-relocated")
    if relocated.exists():
        return relocated
    with _locked():
        if not relocated.exists():
            data = original.read_bytes()
            if _AM_TEMPLATE_DIR not in data:
                raise RuntimeError(f"{original} does not name {_AM_TEMPLATE_DIR.decode()}")
            staging = relocated.with_name(relocated.name + ".partial")
            staging.write_bytes(data.replace(_AM_TEMPLATE_DIR, _AM_TEMPLATE_DIR_RELATIVE))
            staging.chmod(0o755)
            staging.rename(relocated)
    return relocated


def ensure_amtool() -> Path:
    """Path to `amtool` from the Debian `prometheus-alertmanager` package."""
    return _ensure("prometheus-alertmanager", "amtool")


def ensure_etcd() -> Path:
    """Path to the `etcd` server binary from the Debian `etcd-server` package."""
    return _ensure("etcd-server", "etcd")


HAPROXY_LIBRARIES = {  # Debian package: the library of it HAProxy links (absent where the package is not installed)
    "liblua5.3-0": "liblua5.3.so.0",
    "libopentracing1": "libopentracing.so.1",
    "libopentracing-c-wrapper0": "libopentracing-c-wrapper.so.0",
}


def ensure_haproxy() -> tuple[Path, dict[str, str]]:
    """Path to `haproxy` from the Debian package, and the environment to run it with: `LD_LIBRARY_PATH` names
    the directories of the libraries it links, extracted from their own packages likewise."""
    binary = _ensure("haproxy", "haproxy", "usr/sbin")
    dirs: list[str] = []
    for package, library in HAPROXY_LIBRARIES.items():
        pattern = f"usr/lib/*/{library}"
        root = extract(package, partial(_holds, pattern=pattern))
        found = sorted(root.glob(pattern))
        if not found:
            raise RuntimeError(f"{package} has no {pattern}")
        dirs.append(str(found[0].parent))
    return binary, {**os.environ, "LD_LIBRARY_PATH": os.pathsep.join(dict.fromkeys(dirs))}


def _holds(root: Path, pattern: str) -> bool:
    return any(root.glob(pattern))


def ensure_pypi_tools(name: str, packages: list[str]) -> Path:
    """The `bin` folder of a venv in the cache holding `packages` from PyPI (made once, under the lock)."""
    venv = CACHE / name
    done = venv / ".complete"
    with _locked():
        if not done.exists():
            shutil.rmtree(venv, ignore_errors=True)
            for argv in (
                [sys.executable, "-m", "venv", str(venv)],
                [str(venv / "bin" / "pip"), "install", "--quiet", *packages],
            ):
                result = _run(argv)
                if result.returncode != 0:
                    raise RuntimeError(f"{' '.join(argv)} failed: {result.stderr.strip()[-500:]}")
            done.touch()
    return venv / "bin"
