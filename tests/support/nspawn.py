"""A real container for tests: Debian's `systemd-nspawn` over this machine's own OS, read-only, under a tmpfs.

The recipe (shared/reference/real-systemd.md): the host's root is bound to a scratch directory inside a private
mount namespace, and `systemd-nspawn --volatile=overlay --private-network` runs on it, so every write and
deletion inside lands in a tmpfs that vanishes with the container, and its only network is its own loopback.
With `boot=True` the container boots systemd 252 as its PID 1 (never over the host's own file system: only this
way); without it, `command` is the container's PID 1, as `docker run IMAGE COMMAND` without `--init` gives an
entrypoint. `enter` runs a command inside every namespace of the running container (`nsenter`), which is how
the tests drive `systemctl` and reach the container's loopback.

Each container runs in cgroups of its own (`cgroups`), made before it starts and removed after it ends: with
`--keep-unit` systemd-nspawn puts its payload below its own cgroup, so two containers started from one cgroup
would share it, and two booted systemds would manage one `system.slice` between them (a unit's cgroup holding
the other container's processes).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from tests.support.tools import CACHE, extract
from tests.support.wait import wait_for

SYSTEMD_LIBS = Path("/usr/lib/x86_64-linux-gnu/systemd")


def ensure_nspawn() -> Path:
    """`systemd-nspawn` from Debian's `systemd-container`, extracted into the cache (not installed)."""
    root = extract("systemd-container", lambda r: (r / "usr/bin/systemd-nspawn").exists())
    return root / "usr/bin/systemd-nspawn"


def unavailable() -> str | None:
    """Why a container cannot start here (None when it can)."""
    if os.geteuid() != 0:
        return "containers need root (mount namespaces, systemd-nspawn)"
    for tool in ("unshare", "nsenter", "mount"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    if not (SYSTEMD_LIBS / "libsystemd-shared-252.so").exists():
        return f"systemd 252's libsystemd-shared is not in {SYSTEMD_LIBS}"
    if not Path("/proc/self/ns/pid").exists():
        return "this kernel has no PID namespaces"
    return None


@dataclass(frozen=True)
class Bind:
    """A host path seen at `inside` in the container (read-only unless `writable`)."""

    host: Path
    inside: str
    writable: bool = False

    def option(self) -> str:
        return f"--bind{'' if self.writable else '-ro'}={self.host}:{self.inside}"


@dataclass
class Container:
    """One container: started by `start`, always ended by `close` (which kills what is left of it)."""

    workdir: Path
    boot: bool = False
    command: Sequence[str] = ()
    binds: Sequence[Bind] = ()
    options: Sequence[str] = ()  # more systemd-nspawn options
    private_network: bool = True  # only its own loopback; False: the host's network
    proc: subprocess.Popen[bytes] | None = None
    namespace: str = ""  # the PID namespace's inode link, once started
    log: Path = field(init=False)

    def __post_init__(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.hostroot = self.workdir / "hostroot"
        self.hostroot.mkdir(exist_ok=True)
        self.log = self.workdir / "container.log"
        token = hashlib.sha256(str(self.workdir.resolve()).encode()).hexdigest()[:12]
        self.cgroups = own_cgroups(f"nspawn-test-{token}")

    def argv(self) -> list[str]:
        nspawn = ensure_nspawn()
        args = [
            str(nspawn),
            "-D",
            str(self.hostroot),
            "--volatile=overlay",
            *(["--private-network"] if self.private_network else []),
            "--register=no",
            "--keep-unit",
            "--link-journal=no",
            "-q",
            *(b.option() for b in self.binds),
            *self.options,
        ]
        args += ["--boot"] if self.boot else ["--", *self.command]
        # The shell moves itself into the container's cgroups, then binds / in a private mount namespace (the bind
        # vanishes with it); no shell sees a test's words.
        script = (
            'for g in $CGROUPS; do echo $$ > "$g/cgroup.procs" || exit 1; done;'
            ' mount --bind / "$1" && shift && exec "$@"'
        )
        return [
            "env", f"CGROUPS={' '.join(map(str, self.cgroups))}",
            "unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh", str(self.hostroot),
            "env", "-u", "CGROUPS", f"LD_LIBRARY_PATH={SYSTEMD_LIBS}", *args,
        ]  # fmt: skip

    def start(self, timeout_s: float = 60.0) -> Container:
        """Start it; return once its PID 1 runs (and, booted, once systemd answers)."""
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                self.argv(), stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True
            )
        leader = wait_for(lambda: self.leader() or self._ended(), timeout_s, "the container's PID 1")
        self.namespace = os.readlink(f"/proc/{leader}/ns/pid")
        if self.boot:
            wait_for(self._manager_up, timeout_s, "systemd answering in the container")
        return self

    def _ended(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise AssertionError(f"the container ended at once:\n{self.log.read_text()[-3000:]}")
        return False

    def _manager_up(self) -> bool:
        state = self.enter(["systemctl", "is-system-running"], timeout_s=10).stdout.strip()
        return state in ("running", "degraded", "starting")

    def leader(self) -> int | None:
        """The host PID of the container's PID 1 (None until it runs, or once it has ended)."""
        if self.proc is None:
            return None
        try:
            procs = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.Error:
            return None
        for proc in procs:
            if nspid(proc.pid)[-1:] == [1]:
                return proc.pid
        return None

    def pids(self) -> list[int]:
        """Host PIDs of every process in the container's PID namespace (zombies included)."""
        found = []
        for pid in psutil.pids():
            with contextlib.suppress(OSError):
                if self.namespace and os.readlink(f"/proc/{pid}/ns/pid") == self.namespace:
                    found.append(pid)
        return found

    def enter(self, argv: Sequence[str], timeout_s: float = 60.0) -> subprocess.CompletedProcess[str]:
        """Run `argv` inside every namespace of the container (its loopback, its /proc, its systemd)."""
        leader = self.leader()
        if leader is None:
            raise AssertionError("the container is not running")
        return subprocess.run(
            ["nsenter", "-t", str(leader), "-a", "--", *argv],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )

    def signal_leader(self, sig: signal.Signals) -> None:
        """Signal the container's PID 1 from outside, as a container runtime does (`docker stop`, `docker kill`)."""
        leader = self.leader()
        if leader is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(leader, sig)

    def wait(self, timeout_s: float) -> int | None:
        """The container's exit status, or None if it still runs after `timeout_s`."""
        assert self.proc is not None
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def close(self, timeout_s: float = 30.0) -> None:
        """Halt it (SIGTERM to systemd-nspawn, which stops the container) and kill whatever is left."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
            if self.wait(timeout_s) is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        deadline = time.monotonic() + 10
        while self.pids() and time.monotonic() < deadline:
            time.sleep(0.05)
        for group in self.cgroups:
            remove_cgroup(group)


def own_cgroups(name: str) -> list[Path]:
    """A child `name` of this process's cgroup on the unified hierarchy and on systemd's named v1 one (where
    mounted: a hybrid host has both), created; the hierarchies it cannot create one in are left out."""
    roots = {"0": Path("/sys/fs/cgroup/unified"), "name=systemd": Path("/sys/fs/cgroup/systemd")}
    if not roots["0"].is_dir():
        roots["0"] = Path("/sys/fs/cgroup")  # a cgroup v2 only host
    made = []
    with open("/proc/self/cgroup") as fh:
        for line in fh:
            number, controllers, path = line.rstrip("\n").split(":", 2)
            root = roots.get(controllers or number)
            if root is None or not (root / "cgroup.procs").exists():
                continue
            group = root / path.lstrip("/") / name
            with contextlib.suppress(OSError):
                group.mkdir(exist_ok=True)
                made.append(group)
    return made


def remove_cgroup(group: Path) -> None:
    """Remove a cgroup and the ones below it, deepest first (each must be empty by then)."""
    if not group.is_dir():
        return
    for below, _, _ in os.walk(group, topdown=False):
        with contextlib.suppress(OSError):
            os.rmdir(below)


def nspid(pid: int) -> list[int]:
    """A process's PID in each PID namespace it is in, outermost first (`NSpid:` of /proc/PID/status)."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("NSpid:"):
                    return [int(x) for x in line.split()[1:]]
    except (OSError, ValueError):
        return []
    return []


def cache_dir(name: str) -> Path:
    """A folder of the tools cache for a container tier's own files."""
    path = CACHE / name
    path.mkdir(parents=True, exist_ok=True)
    return path
