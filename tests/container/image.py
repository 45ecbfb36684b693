"""The image the container tier runs: the shipped `examples/Dockerfile`, built unchanged from the tier's wheel.

Its base, `lmsysorg/sglang:v0.5.23-cu130`, is made here without a pull: `debootstrap --variant=minbase bookworm`
through the host's apt mirror, with a stand-in `sglang` package (the Dockerfile's guard imports it; the tier's
servers are the simulator, which the wheel carries) and the host's extra CA certificates (the build's pip reaches
the package registry as the host's does). The root file system is cached as a tarball under
`~/.cache/sglang-supervisor/container-base/` (minutes to make, once per machine); each engine imports it under the
official tag, so the Dockerfile's `FROM` resolves locally, and builds the Dockerfile with the wheel beside it.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from pathlib import Path

from tests.container.engines import Engine
from tests.support.paths import REPO
from tests.support.tools import CACHE, file_lock

BASE = "lmsysorg/sglang:v0.5.23-cu130"
TAG = "sglang-supervisor:test"
SUITE = "bookworm"
INCLUDE = "python3,python3-venv,python3-pip,ca-certificates,procps"
SOURCES = (Path("/etc/apt/sources.list.d/debian.sources"), Path("/etc/apt/sources.list"))
MIRROR = "http://deb.debian.org/debian"
STANDIN_LAUNCH = (
    "import sys\n"
    "sys.exit('a stand-in for SGLang (the container tier builds its base image without a pull): '\n"
    "         'the tier supervises the simulator')\n"
)
_TIMEOUT_S = 1200


def mirror() -> str:
    """The Debian mirror apt uses on this host (its first `deb` URI), else Debian's own."""
    for path in SOURCES:
        if path.exists():
            found = re.search(
                r"^(?:URIs:\s*|deb\s+(?:\[[^]]*\]\s+)?)(\S+/debian)/?\s*$", path.read_text(), re.M
            )
            if found:
                return found.group(1)
    return MIRROR


def _run(argv: list[str], what: str) -> None:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=_TIMEOUT_S, check=False)
    if result.returncode != 0:
        raise RuntimeError(
            f"{what} failed (exit {result.returncode}):\n{(result.stdout + result.stderr)[-3000:]}"
        )


def base_rootfs() -> Path:
    """The base image's root file system as a tarball, made once (under a lock) and cached."""
    folder = CACHE / "container-base"
    tarball = folder / f"{SUITE}-sglang-0.5.23.tar"
    with file_lock(folder / "lock"):
        if tarball.exists():
            return tarball
        root = folder / "rootfs.partial"
        shutil.rmtree(root, ignore_errors=True)
        _run(
            ["debootstrap", "--variant=minbase", f"--include={INCLUDE}", SUITE, str(root), mirror()],
            "debootstrap",
        )
        site = root / "usr/local/lib/python3.11/dist-packages"
        (site / "sglang").mkdir(parents=True)
        (site / "sglang/__init__.py").write_text('__version__ = "0.5.23"\n')
        (site / "sglang/launch_server.py").write_text(STANDIN_LAUNCH)
        (site / "sglang-0.5.23.dist-info").mkdir()
        (site / "sglang-0.5.23.dist-info/METADATA").write_text(
            "Metadata-Version: 2.1\nName: sglang\nVersion: 0.5.23\n"
        )
        for cert in Path("/usr/local/share/ca-certificates").glob("*.crt"):
            shutil.copy(cert, root / "usr/local/share/ca-certificates" / cert.name)
        _run(["chroot", str(root), "update-ca-certificates"], "update-ca-certificates")
        for junk in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for path in (root / junk).glob("*"):
                if path.is_file():
                    path.unlink()
        partial = tarball.with_name(tarball.name + ".partial")
        _run(["tar", "-C", str(root), "-cf", str(partial), "."], "tar of the base")
        partial.rename(tarball)
        shutil.rmtree(root, ignore_errors=True)
    return tarball


def dockerfile() -> Path:
    return REPO / "examples" / "Dockerfile"


def build(engine: Engine, wheel: Path, context: Path, source: Path | None = None) -> float:
    """Import the base under its official tag and build `source` (the shipped Dockerfile) as TAG; the build's
    seconds."""
    engine("import", "--change", 'CMD ["/bin/bash"]', str(base_rootfs()), BASE, timeout_s=300)
    return build_on(engine, wheel, context, TAG, source=source)


def build_on(
    engine: Engine,
    wheel: Path,
    context: Path,
    tag: str,
    build_args: tuple[str, ...] = (),
    source: Path | None = None,
) -> float:
    """Build `source` (the shipped Dockerfile) as `tag` from a context holding only it and the wheel, with
    `--build-arg`s `build_args` (its base already in the engine); the build's seconds."""
    context.mkdir(parents=True, exist_ok=True)
    shutil.copy(source or dockerfile(), context / "Dockerfile")
    shutil.copy(wheel, context / wheel.name)
    argv = ["build", "--network", "host", "-f", str(context / "Dockerfile"), "-t", tag]
    argv += [arg for value in build_args for arg in ("--build-arg", value)]
    if engine.name == "podman":  # the default OCI format drops HEALTHCHECK
        argv += ["--format", "docker", "--pull=never"]
    started = time.monotonic()
    engine(*argv, str(context), timeout_s=900)
    return time.monotonic() - started
