"""The real PD pair's extra pieces, installed once beside the serving venv for the `real_pd` tier.

`pd-<hash12>/` is a venv holding only `requirements-real-pd.txt` (the Mooncake transfer engine without CUDA,
msgpack); a `.pth` file adds the serving venv's site-packages (which in turn names the CLI venv's), so the
interpreter has the whole server plus Mooncake. Mooncake's native library links libibverbs and libnl: the three
Debian packages are extracted into the tools cache (`apt-get download`, `dpkg-deb -x`, nothing installed on the
host) and `library_path()` names their folders for `LD_LIBRARY_PATH`. The marker is written only once the smoke
import (`mooncake.engine`, with those libraries) passes, so a half install is redone.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import sys
import time
from functools import partial
from pathlib import Path

from tests.support import real_sglang
from tests.support.real_sglang import RealSglangError, cache_root, real_serving_python
from tests.support.tools import extract

PD_REQUIREMENTS = real_sglang._ROOT / "requirements-real-pd.txt"
LIBRARIES = {  # Debian package: the library of it Mooncake's engine links
    "libibverbs1": "libibverbs.so.1",
    "libnl-3-200": "libnl-3.so.200",
    "libnl-route-3-200": "libnl-route-3.so.200",
}
SMOKE = "import mooncake.engine; from sglang.srt.disaggregation.mooncake import conn"


def library_path() -> str:
    """`LD_LIBRARY_PATH` naming the extracted libraries' folders (extracted once)."""
    dirs: list[str] = []
    for package, library in LIBRARIES.items():
        pattern = f"**/{library}"
        root = extract(package, partial(_holds, pattern=pattern))
        found = sorted(root.glob(pattern))
        if not found:
            raise RealSglangError(f"{package} has no {library}")
        dirs.append(str(found[0].parent))
    return os.pathsep.join(dict.fromkeys(dirs))


def _holds(root: Path, pattern: str) -> bool:
    return any(root.glob(pattern))


def pd_venv_dir() -> Path:
    """`pd-<hash12>`: keyed by the serving venv's own inputs and the PD requirements."""
    inputs = (
        real_sglang.REQUIREMENTS,
        real_sglang.SERVING_REQUIREMENTS,
        real_sglang.STANDIN,
        PD_REQUIREMENTS,
    )
    return cache_root() / f"pd-{real_sglang._digest(inputs)[:12]}"


def real_pd_python(timeout_s: float = 2400) -> Path:
    """The PD venv's interpreter (the serving venv installed first when needed); raises RealSglangError."""
    deadline = time.monotonic() + timeout_s
    serving = real_serving_python(timeout_s).parent.parent
    libraries = library_path()
    target = pd_venv_dir()
    python = target / "bin" / "python"
    marker = target / ".install-complete"
    if marker.is_file() and python.exists():
        return python
    fd = real_sglang._lock(target.parent / f"{target.name}.lock", deadline)
    try:
        if not (marker.is_file() and python.exists()):
            _install(target, serving, libraries, deadline)
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
    return python


def _install(target: Path, serving: Path, libraries: str, deadline: float) -> None:
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    log = target / "install.log"
    real_sglang._run([sys.executable, "-m", "venv", str(target)], deadline, log)
    # `import site` lines run: the serving site's own .pth (the CLI venv) is processed too.
    base = real_sglang._site(serving)
    (real_sglang._site(target) / "_sglsup_serving.pth").write_text(
        f"import site; site.addsitedir({str(base)!r})\n"
    )
    python = target / "bin" / "python"
    pip = [str(python), "-m", "pip", "install", "--no-deps", "--no-input", "-r", str(PD_REQUIREMENTS)]
    try:
        real_sglang._run(pip, deadline, log)
    except RealSglangError:
        real_sglang._run(pip, deadline, log)
    real_sglang._run(["env", f"LD_LIBRARY_PATH={libraries}", str(python), "-c", SMOKE], deadline, log)
    (target / ".install-complete").write_text(target.name + "\n")
