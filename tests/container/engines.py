"""Real container engines for the container tier: Debian's docker.io 20.10 and podman 4.3, both rootful.

Everything they keep lives under one private folder of the test session (shared/reference/container-engines.md):

- **docker**: a `dockerd` the tier starts by hand with its data and exec roots, socket and pidfile there,
  `--bridge=none` and every firewall and forwarding switch off, overlay2, ulimits within this machine's
  (`nofile` 20000, `nproc` 32768: root here lacks `CAP_SYS_RESOURCE`). It is stopped by its pidfile at the end of
  the session. Debian's own CLI (`/usr/bin/docker`, 20.10) drives it: a `/usr/local/bin/docker` may be another
  client that shadows it on PATH.
- **podman**: no daemon; `CONTAINERS_CONF` and `CONTAINERS_STORAGE_CONF` point it at config files in the folder
  (storage there, `runtime = "runc"` since crun 1.8 refuses this machine's hybrid cgroups, the cgroupfs manager
  for want of systemd, the same ulimits, catatonit for `--init`).

No bridge network exists for either: containers run with `--network none` (their own loopback, which the tests
reach through the container's network namespace) or, where a test needs the host's ports, `--network host`. The
host's network and firewall are never changed. Missing packages are installed with `apt-get install -y` (CI runs
on a clean machine as root), with services kept from starting by `policy-rc.d` for the duration.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.tools import file_lock
from tests.support.wait import wait_for

DOCKER = "/usr/bin/docker"
DOCKERD = "/usr/sbin/dockerd"
PODMAN = "/usr/bin/podman"
ULIMITS = ("nofile=20000:20000", "nproc=32768:32768")
# package → a file it installs; docker.io without its recommends (apparmor, criu, needrestart)
PACKAGES = {
    "docker.io": DOCKERD,
    "runc": "/usr/sbin/runc",
    "podman": PODMAN,
    "catatonit": "/usr/bin/catatonit",
    "debootstrap": "/usr/sbin/debootstrap",
    "docker-compose": "/usr/bin/docker-compose",  # Compose 1.29, for `config` of examples/compose.yaml
}
POLICY_RC = Path("/usr/sbin/policy-rc.d")
_APT_TIMEOUT_S = 900


def _apt(argv: list[str]) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=_APT_TIMEOUT_S, check=False)


def ensure_packages(lock: Path) -> str | None:
    """Install what is missing of the engines' Debian packages; why they cannot be had (None when they can)."""
    if os.geteuid() != 0:
        return "real container engines need root (dockerd, rootful podman, apt-get install)"
    with file_lock(lock):
        missing = [name for name, path in PACKAGES.items() if not Path(path).exists()]
        if not missing:
            return None
        placed = not POLICY_RC.exists()
        if placed:  # the packages' services stay unstarted (no dockerd with a bridge and iptables rules)
            POLICY_RC.write_text("#!/bin/sh\nexit 101\n")
            POLICY_RC.chmod(0o755)
        try:
            result = _apt(["apt-get", "install", "-y", "--no-install-recommends", *missing])
            if result.returncode != 0:
                _apt(["apt-get", "update"])
                result = _apt(["apt-get", "install", "-y", "--no-install-recommends", *missing])
        finally:
            if placed:
                POLICY_RC.unlink()
    if result.returncode != 0:
        return f"apt-get install {' '.join(missing)} failed: {result.stderr.strip()[-400:]}"
    return None


@dataclass
class Engine:
    """One engine's CLI with its environment; `__call__` runs it."""

    name: str  # "docker" or "podman"
    argv0: list[str]
    env: dict[str, str]
    root: Path
    proc: subprocess.Popen[bytes] | None = None  # dockerd, once started
    extra_run: list[str] = field(default_factory=list)

    def __call__(
        self, *args: str, timeout_s: float = 120.0, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [*self.argv0, *args], capture_output=True, text=True, env=self.env, timeout=timeout_s, check=False
        )
        if check and result.returncode != 0:
            raise AssertionError(
                f"{self.name} {' '.join(args)} exited {result.returncode}:\n{result.stdout}{result.stderr}"[
                    -4000:
                ]
            )
        return result

    def inspect(self, name: str) -> dict[str, Any]:
        """`inspect` of a container (or image), as a dict."""
        found = json.loads(self("inspect", name).stdout)
        assert isinstance(found, list) and found, found
        return dict(found[0])

    def state(self, name: str) -> dict[str, Any]:
        return dict(self.inspect(name)["State"])

    def host_pid(self, name: str) -> int:
        """The host PID of the container's PID 1 (0 when it is not running)."""
        return int(self.state(name)["Pid"] or 0)

    def health(self, name: str) -> str:
        """The engine's health status of the container (`starting`, `healthy`, `unhealthy`)."""
        state = self.state(name)
        return str((state.get("Health") or state.get("Healthcheck") or {}).get("Status", ""))

    def close(self) -> None:
        """Remove every container, then end dockerd (by its pidfile) and undo every mount left in the folder."""
        left = self.containers()
        if left:
            self("rm", "-f", *left, timeout_s=120, check=False)
        if self.name == "podman":
            self("system", "reset", "-f", timeout_s=300, check=False)
        else:
            stop_dockerd(self)
        unmount_below(self.root)
        scratch = self.root / "tmp"
        if scratch.is_symlink():
            shutil.rmtree(scratch.resolve(), ignore_errors=True)

    def containers(self) -> list[str]:
        out = self("ps", "-aq", check=False).stdout
        return out.split()


def start_docker(root: Path) -> Engine:
    """A dockerd of the tier's own under `root`, answering on its socket."""
    for sub in ("data", "exec"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    sock = root / "docker.sock"
    argv = [
        DOCKERD,
        "--data-root", str(root / "data"), "--exec-root", str(root / "exec"),
        "--pidfile", str(root / "dockerd.pid"), "-H", f"unix://{sock}",
        "--bridge=none", "--iptables=false", "--ip6tables=false", "--ip-forward=false", "--ip-masq=false",
        "--userland-proxy=false", "--storage-driver", "overlay2",
        *(arg for limit in ULIMITS for arg in ("--default-ulimit", limit)),
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("DOCKER_")}
    env["DOCKER_HOST"] = f"unix://{sock}"
    with (root / "dockerd.log").open("ab") as log:
        proc = subprocess.Popen(
            argv, stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True
        )
    engine = Engine("docker", [DOCKER], env, root, proc)

    def answering() -> bool:
        if proc.poll() is not None:
            raise AssertionError(
                f"dockerd exited {proc.returncode}:\n{(root / 'dockerd.log').read_text()[-3000:]}"
            )
        return engine("version", timeout_s=10, check=False).returncode == 0

    wait_for(answering, 60, "dockerd answering on its socket", interval=0.1)
    return engine


def stop_dockerd(engine: Engine) -> None:
    """SIGTERM to the dockerd of the pidfile (ours), SIGKILL after a minute; its containerd likewise."""
    pidfile = engine.root / "dockerd.pid"
    with contextlib.suppress(OSError, ValueError):
        os.kill(int(pidfile.read_text()), signal.SIGTERM)
    if engine.proc is not None:
        try:
            engine.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            engine.proc.kill()
            engine.proc.wait(timeout=10)
    containerd = engine.root / "exec" / "containerd" / "containerd.pid"
    with contextlib.suppress(OSError, ValueError):
        pid = int(containerd.read_text())
        if str(engine.root) in Path(f"/proc/{pid}/cmdline").read_text():
            os.kill(pid, signal.SIGTERM)


def podman(root: Path) -> Engine:
    """Rootful podman with its configuration, storage and state under `root`, and its temporary files in a short
    folder of /tmp that `root` links to (slirp4netns puts its API socket there, and a socket's path must be
    under 108 bytes: pytest's temporary folders are longer)."""
    conf = root / "conf"
    for sub in ("conf", "run", "storage", "networks"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    (root / "tmp").symlink_to(tempfile.mkdtemp(prefix="sglsup-podman-", dir="/tmp"))
    ulimits = ", ".join(json.dumps(limit) for limit in ULIMITS)
    (conf / "containers.conf").write_text(
        "[engine]\n"
        'runtime = "runc"\n'
        'cgroup_manager = "cgroupfs"\n'
        'events_logger = "file"\n'
        f'events_logfile_path = "{root}/events.log"\n'
        f'tmp_dir = "{(root / "tmp").resolve()}"\n'
        f'volume_path = "{root}/storage/volumes"\n'
        f'static_dir = "{root}/storage/libpod"\n'
        "[network]\n"
        f'network_config_dir = "{root}/networks"\n'
        "[containers]\n"
        f"default_ulimits = [{ulimits}]\n"
        'init_path = "/usr/bin/catatonit"\n'
    )
    (conf / "storage.conf").write_text(
        f'[storage]\ndriver = "overlay"\nrunroot = "{root}/run"\ngraphroot = "{root}/storage"\n'
    )
    env = {
        **os.environ,
        "CONTAINERS_CONF": str(conf / "containers.conf"),
        "CONTAINERS_STORAGE_CONF": str(conf / "storage.conf"),
        "TMPDIR": str((root / "tmp").resolve()),
    }
    return Engine("podman", [PODMAN], env, root)


def unmount_below(root: Path) -> None:
    """Lazily unmount whatever is still mounted under `root` (an engine's overlay or netns mounts), deepest first."""
    prefix = str(root.resolve()) + "/"
    with open("/proc/self/mountinfo") as fh:
        points = [line.split()[4] for line in fh]
    for point in sorted((p for p in points if p.startswith(prefix)), key=len, reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True, check=False, timeout=30)
