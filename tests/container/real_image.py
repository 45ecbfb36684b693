"""The image on a base that holds the real SGLang 0.5.23 CPU install: the shipped Dockerfile built unchanged on it.

The base is the tier's Debian root file system with the real-serving tier's cached venv (SGLang 0.5.23 and torch
for CPU, `tests/support/real_sglang.py`: the serving venv and the `real` venv's site-packages its `.pth` file
names) and the Python it was made with, all at the paths they have on this host (a venv names its interpreter by
absolute path), the venv's `bin` first on `PATH`: its `python3` is the image's, as an SGLang image's is. It is
streamed into the engine's `import` as one tar (about 4 GB; the interpreter's own site-packages and test suite are
left out), so no build context carries it. The venv's pip trusts certifi's bundle, not the system's: `PIP_CERT`
points it at the base's bundle, which holds the host's extra CAs, as the host's own pip configuration does.
"""

from __future__ import annotations

import subprocess
import tarfile
import time
from pathlib import Path

from tests.container.engines import Engine
from tests.container.image import base_rootfs, build_on

REAL_BASE = "sglang-real-cpu"
REAL_VERSION = "v0.5.23"
REAL_TAG = "sglang-supervisor:real"
CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"  # the base's, with the host's extra CAs in it
_SKIP = ("lib/python3.11/site-packages/", "lib/python3.11/test/")


def _interpreter(venv: Path) -> Path:
    """The installation the venv was made from (`home` of its pyvenv.cfg, the folder above its bin/)."""
    for line in (venv / "pyvenv.cfg").read_text().splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "home":
            return Path(value.strip()).parent
    raise AssertionError(f"{venv}/pyvenv.cfg names no home")


def import_real_base(engine: Engine, venv: Path, timeout_s: float = 900) -> float:
    """Import the stand-in base plus the interpreter and the serving venv as REAL_BASE:REAL_VERSION; seconds."""
    home = _interpreter(venv)
    path = f"{venv}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    changes = [f"ENV PATH={path}", f"ENV PIP_CERT={CA_BUNDLE}", 'CMD ["/bin/bash"]']
    argv = [
        *engine.argv0,
        "import",
        *(a for c in changes for a in ("--change", c)),
        "-",
        f"{REAL_BASE}:{REAL_VERSION}",
    ]
    started = time.monotonic()
    said = engine.root / "import-real.log"
    with said.open("wb") as log:
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=log, stderr=log, env=engine.env)
    assert proc.stdin is not None
    try:
        with tarfile.open(fileobj=proc.stdin, mode="w|") as out:
            with tarfile.open(base_rootfs(), mode="r:") as base:
                for member in base:
                    out.addfile(member, base.extractfile(member) if member.isfile() else None)
            for top in (home, venv, *_layered(venv)):
                out.add(top, arcname=str(top).lstrip("/"), filter=lambda m: _keep(m, home))
    except BaseException:  # the stream broke (or the run was interrupted): the import is not left running
        proc.kill()
        proc.wait(timeout=60)
        raise
    finally:
        proc.stdin.close()
    code = proc.wait(timeout=timeout_s)
    assert code == 0, f"{engine.name} import exited {code}: {said.read_text()[-2000:]}"
    return time.monotonic() - started


def _layered(venv: Path) -> list[Path]:
    """The folders the venv's `.pth` files add to its path (the serving venv reaches the `real` venv's
    site-packages, where SGLang itself is, through one)."""
    found = []
    for pth in (venv / "lib/python3.11/site-packages").glob("*.pth"):
        for line in pth.read_text().splitlines():
            if line.startswith("/") and Path(line).is_dir():
                found.append(Path(line))
    return found


def _keep(member: tarfile.TarInfo, home: Path) -> tarfile.TarInfo | None:
    inside = str(home).lstrip("/") + "/"
    if member.name.startswith(inside) and member.name[len(inside) :].startswith(_SKIP):
        return None
    return member


def build_real(engine: Engine, wheel: Path, context: Path, venv: Path) -> tuple[float, float]:
    """The real base imported and the shipped Dockerfile built on it as REAL_TAG: (import s, build s)."""
    imported = import_real_base(engine, venv)
    args = (f"SGLANG_IMAGE={REAL_BASE}", f"SGLANG_VERSION={REAL_VERSION}")
    return imported, build_on(engine, wheel, context, REAL_TAG, args)
