"""A booted systemd 252 with the product installed as the README says, driven from outside with `systemctl`.

One container (tests/support/nspawn.py: the host's OS read-only under a tmpfs overlay, a private network)
serves the whole tier. `Machine.install` puts the wheel into `/opt/sglang-supervisor/venv` with Debian's
`/usr/bin/python3` (the dev interpreter lives under /root, which the unit's ProtectHome=yes hides), creates the
`sglang` system user, runs `install-unit` and writes the simulator config; the tests then only use `systemctl`,
`journalctl`, the status endpoint on the container's loopback, and what an operator can read in `/proc`.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.nspawn import Bind, Container
from tests.support.wait import wait_for

UNIT = "sglang-supervisor"
VENV = "/opt/sglang-supervisor/venv"
SUP = f"{VENV}/bin/sglang-supervisor"
CONFIG = "/etc/sglang-supervisor/config.toml"
STATE = "/var/lib/sglang-supervisor"
LOGS = "/var/log/sglang-supervisor"
SIM = f"{STATE}/sim"  # the stand-in GPUs are regular files: inside StateDirectory=, so ReadWritePaths= holds them
DEVICES = (f"{SIM}/dev/nvidia0", f"{SIM}/dev/nvidia1")
STATUS_URL = "http://127.0.0.1:9400"
SGLANG_URL = "http://127.0.0.1:30000"
MODEL = "moonshotai/Kimi-K2.5"
FILES = "/srv/test"  # this tier's files (config, wheels, helper scripts), bound read-only
HOUSE = "/srv/wheelhouse"  # the wheel's dependencies, bound read-only: pip installs offline
HERE = Path(__file__).resolve().parent
SPAN_UNITS = {"h": 3600.0, "min": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6}  # systemd's time spans, in seconds
REACTION_S = 1.5  # systemd's own part of a restart: the exit noticed, the restart timer fired, the exec
FIGURES: dict[str, str] = {}  # measured figures of this run, printed in the tier's summary


@dataclass
class Machine:
    """The container and what the tests ask of it."""

    container: Container
    files: Path  # the host's side of FILES
    wheel: str  # the installed wheel's file name under FILES

    @classmethod
    def boot(cls, workdir: Path, files: Path, house: Path, wheel: str) -> Machine:
        # An empty multi-user.target.wants hides the host's enabled services (fewer to boot and run beside ours);
        # `systemctl enable` writes its link there.
        wants = workdir / "wants"
        wants.mkdir(parents=True, exist_ok=True)
        binds = [
            Bind(files, FILES),
            Bind(house, HOUSE),
            Bind(wants, "/etc/systemd/system/multi-user.target.wants", writable=True),
        ]
        # The host's timers (apt's daily runs, man-db) stay out the same way.
        hidden = ["--tmpfs=/etc/systemd/system/timers.target.wants"]
        return cls(Container(workdir, boot=True, binds=binds, options=hidden).start(), files, wheel)

    def close(self) -> None:
        self.container.close()

    def sh(self, script: str, timeout_s: float = 120.0, check: bool = True) -> str:
        """Run a shell script inside the container (as root); its stdout, or a failure naming its output."""
        result = self.container.enter(["sh", "-c", script], timeout_s=timeout_s)
        if check and result.returncode != 0:
            raise AssertionError(
                f"`{script}` exited {result.returncode}:\n{result.stdout}{result.stderr}"[-4000:]
            )
        return result.stdout

    def run(self, argv: Sequence[str], timeout_s: float = 120.0) -> subprocess.CompletedProcess[str]:
        """Run a command inside the container, whatever its exit status."""
        return self.container.enter(list(argv), timeout_s=timeout_s)

    def put(self, dest: str, text: str, mode: str = "0644") -> None:
        """Write `text` to `dest` inside the container (through FILES), group `sglang`, atomically."""
        name = dest.strip("/").replace("/", "_")
        (self.files / name).write_text(text)
        self.sh(f"install -m {mode} -g sglang {FILES}/{name} {dest}.new && mv {dest}.new {dest}")

    def install(self) -> float:
        """The README's install, timed: venv, offline pip install, the user, install-unit, the config."""
        started = time.monotonic()
        self.sh(
            f"/usr/bin/python3 -m venv {VENV}"
            f" && {VENV}/bin/pip install --quiet --no-index --find-links {HOUSE} {FILES}/{self.wheel}"
            " && useradd --system --home-dir /var/lib/sglang-supervisor --shell /usr/sbin/nologin sglang"
            f" && {SUP} install-unit"
            f" && install -d -o sglang -g sglang {STATE} {LOGS}"
            f" && install -m 0644 {FILES}/config.toml {CONFIG}"
            f" && runuser -u sglang -- {SUP} check-config --config {CONFIG}"
            " && systemctl daemon-reload",
            timeout_s=600,
        )
        return time.monotonic() - started

    # ---- systemd
    def show(self, *props: str) -> dict[str, str]:
        """`systemctl show -p …` of the unit."""
        out = self.sh(f"systemctl show {UNIT} " + " ".join(f"-p {p}" for p in props))
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def prop(self, name: str) -> str:
        return self.show(name).get(name, "")

    def monotonic_s(self, prop: str) -> float:
        """A `…TimestampMonotonic` property in seconds of the container's CLOCK_MONOTONIC (the host's)."""
        return int(self.prop(prop) or 0) / 1e6

    def systemctl(self, *args: str, timeout_s: float = 240.0) -> subprocess.CompletedProcess[str]:
        return self.run(["systemctl", *args], timeout_s=timeout_s)

    def main_pid(self) -> int:
        return int(self.prop("MainPID") or 0)

    def kill(self, signal: str, whom: str = "main") -> float:
        """`systemctl kill -s SIGNAL --kill-whom=WHOM`; the container's wall time just before it."""
        out = self.sh(f"date +%s.%N; systemctl kill -s {signal} --kill-whom={whom} {UNIT}")
        return float(out.split()[0])

    def reset(self) -> None:
        """`systemctl reset-failed`: the start limit's count back to zero (every start counts, manual ones too).
        A unit never started, or stopped and unreferenced, is not loaded and has nothing to reset."""
        result = self.systemctl("reset-failed", UNIT)
        if result.returncode != 0 and "not loaded" not in result.stderr:
            raise AssertionError(f"systemctl reset-failed: {result.stderr}")

    def cursor(self) -> str:
        """The unit's journal position now: what a test's journal reads start from ("" before its first line)."""
        # The unit's own last entry: journalctl's --after-cursor skips one entry past the cursor as if it matched
        # the unit, so a cursor of another unit's entry would lose the unit's next line.
        out = self.sh(f"journalctl -u {UNIT} -n 0 --show-cursor --no-pager -q || true")
        return out.strip().rsplit("cursor: ", 1)[-1]

    def journal(self, after: str, *args: str) -> list[dict[str, Any]]:
        """The unit's journal entries after the cursor `after` (every one with ""; `journalctl -o json`),
        systemd's own messages included."""
        since = [f"--after-cursor={after}"] if after else []
        out = self.sh(
            f"journalctl -u {UNIT} -o json --no-pager " + " ".join(shlex.quote(a) for a in [*since, *args])
        )
        return [json.loads(line) for line in out.splitlines() if line.strip()]

    def messages(self, after: str) -> list[str]:
        return [str(e.get("MESSAGE", "")) for e in self.journal(after)]

    def events(self, after: str, name: str) -> list[dict[str, Any]]:
        """The daemon's structured lines of event `name` after `after`."""
        found = []
        for message in self.messages(after):
            if message.startswith("{"):
                line = json.loads(message)
                if line.get("event") == name:
                    found.append(line)
        return found

    # ---- the product, as an operator reads it
    def status(self) -> dict[str, Any] | None:
        """The daemon's /status (None while it does not answer)."""
        result = self.run(["curl", "-sf", "-m", "3", STATUS_URL + "/status"], timeout_s=10)
        if result.returncode != 0:
            return None
        try:
            body = json.loads(result.stdout)
        except ValueError:
            return None
        return body if isinstance(body, dict) else None

    def server(self) -> dict[str, Any] | None:
        """The one server's entry of /status."""
        body = self.status()
        return body["servers"][0] if body else None

    def wait_server(self, check: Any, timeout_s: float, what: str) -> dict[str, Any]:
        """Poll /status until `check(server)` holds; the server entry then."""

        def probe() -> dict[str, Any] | None:
            server = self.server()
            return server if server is not None and check(server) else None

        return wait_for(probe, timeout_s, what, interval=0.1)

    def wait_serving(self, timeout_s: float = 90.0) -> dict[str, Any]:
        return self.wait_server(lambda s: s["state"] == "serving", timeout_s, "the server serving")

    def wait_new_daemon(self, before: dict[str, Any], timeout_s: float = 60.0) -> dict[str, Any]:
        """The /status of the daemon that followed `before`, once it adopted the server and serves it again."""

        def probe() -> dict[str, Any] | None:
            now = self.status()
            if now is None or now["started_at"] == before["started_at"]:
                return None
            server = now["servers"][0]
            return now if server["state"] == "serving" and server["adopted"] else None

        return wait_for(probe, timeout_s, "a new daemon serving its adopted server", interval=0.1)

    def started_wall(self) -> float:
        """When systemd started the current main process, in wall-clock seconds."""
        return self.monotonic_s("ExecMainStartTimestampMonotonic") + time.time() - time.monotonic()

    def delay_s(self, *props: str) -> float:
        """The sum of the unit's delays named by `props` (`WatchdogUSec`, `RestartUSec`: `3s`, `500ms`, `3min`), in s."""
        return sum(
            float(number) * SPAN_UNITS[unit]
            for value in self.show(*props).values()
            for number, unit in re.findall(r"([\d.]+)(min|ms|us|h|s)", value)
        )

    def gap(self, fault_at: float, after: dict[str, Any], delays: Sequence[str]) -> float:
        """Seconds from a fault of the daemon to its successor's adoption of the server, asserted to be no more
        than the unit's `delays` plus that daemon's own start (and systemd's reaction)."""
        adopted = float(after["servers"][0]["adopted"]["at"])
        own_start = adopted - self.started_wall()
        allowed = self.delay_s(*delays) + own_start + REACTION_S
        assert adopted - fault_at <= allowed, (
            f"{adopted - fault_at:.2f} s from the fault to the adoption; the unit allows {allowed:.2f} s "
            f"({' + '.join(delays)} + the daemon's own start {own_start:.2f} s + {REACTION_S} s)"
        )
        return adopted - fault_at

    def incidents(self) -> list[dict[str, Any]]:
        """Every incident of the journal file, last version of each."""
        out = self.sh(f"cat {STATE}/incidents.jsonl 2>/dev/null || true")
        latest: dict[str, dict[str, Any]] = {}
        for line in out.splitlines():
            if line.strip():
                entry = json.loads(line)
                latest[entry["id"]] = entry
        return list(latest.values())

    def processes(self) -> list[tuple[int, str, str]]:
        """(pid, user, command line) of every process in the container (its PID namespace's numbers)."""
        rows = []
        for line in self.sh("ps -e -ww -o pid=,user:20=,args=").splitlines():
            pid, user, args = line.split(None, 2)
            rows.append((int(pid), user, args))
        return rows

    def trees(self) -> list[int]:
        """PIDs of the SGLang (simulator) main processes alive (not the daemon's `--help` of it, for its flags)."""
        return [
            pid
            for pid, _, args in self.processes()
            if "-m simulator.launch_server" in args and "--help" not in args.split()
        ]

    def ranks(self) -> list[tuple[int, str]]:
        """(pid, user) of every scheduler rank alive."""
        return [(pid, user) for pid, user, args in self.processes() if args.startswith("sglang::scheduler")]

    def one_tree(self) -> bool:
        """Exactly one server tree: one main, its two ranks."""
        return len(self.trees()) == 1 and len(self.ranks()) == 2

    def holders(self, paths: Sequence[str]) -> list[int]:
        """PIDs holding any of `paths` open (an `/proc/*/fd` scan, as `fuser` does)."""
        script = (
            "import os, sys\n"
            "want = set(sys.argv[1:])\n"
            "for pid in filter(str.isdigit, os.listdir('/proc')):\n"
            "    try: fds = os.listdir(f'/proc/{pid}/fd')\n"
            "    except OSError: continue\n"
            "    for fd in fds:\n"
            "        try: target = os.readlink(f'/proc/{pid}/fd/{fd}')\n"
            "        except OSError: continue\n"
            "        if target in want: print(pid); break\n"
        )
        out = self.run(["/usr/bin/python3", "-c", script, *paths]).stdout
        return [int(x) for x in out.split()]

    def post(self, url: str, body: dict[str, Any], timeout_s: float = 5.0) -> str:
        """POST a JSON body from inside the container; the answer."""
        argv = ["curl", "-s", "-m", str(timeout_s), "-H", "Content-Type: application/json"]
        return self.run([*argv, "-d", json.dumps(body), url], timeout_s=timeout_s + 10).stdout

    def record(self, name: str, value: str) -> None:
        """A figure of this run, printed in the tier's summary."""
        FIGURES[name] = value
        print(f"{name}: {value}")
