"""Real Prometheus tools and etcd for tests, taken out of the Debian packages without installing any service.

`apt-get download prometheus prometheus-alertmanager etcd-server` into `~/.cache/sglang-supervisor/debs` (outside the
clone), `dpkg-deb -x` each into the cache (staged, then renamed into place), and return the binary path. A file lock serialises concurrent
pytest processes; a binary already extracted is reused.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

CACHE = Path(os.environ.get("SGLSUP_TOOLS_CACHE", Path.home() / ".cache" / "sglang-supervisor"))
_TIMEOUT_S = 600
_AM_TEMPLATE_DIR = b"/usr/share/prometheus/alertmanager"
_AM_TEMPLATE_DIR_RELATIVE = b"usr//share/prometheus/alertmanager"


@contextmanager
def _locked() -> Iterator[None]:
    CACHE.mkdir(parents=True, exist_ok=True)
    with (CACHE / "tools.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


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


def _ensure(package: str, binary: str) -> Path:
    root = CACHE / "root" / package
    path = root / "usr" / "bin" / binary
    if path.exists():
        return path
    with _locked():
        if not path.exists():
            deb = _download(package)
            staging = root.with_name(f"{package}.partial")
            shutil.rmtree(staging, ignore_errors=True)
            staging.parent.mkdir(parents=True, exist_ok=True)
            result = _run(["dpkg-deb", "-x", str(deb), str(staging)])
            if result.returncode != 0:
                raise RuntimeError(f"dpkg-deb -x {deb.name} failed: {result.stderr.strip()[-500:]}")
            shutil.rmtree(root, ignore_errors=True)
            staging.rename(root)
    if not path.exists():
        raise RuntimeError(f"{package} has no usr/bin/{binary}")
    return path


def ensure_promtool() -> Path:
    """Path to `promtool` from the Debian `prometheus` package."""
    return _ensure("prometheus", "promtool")


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
