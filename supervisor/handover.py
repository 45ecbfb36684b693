"""A planned upgrade of the supervisor that costs no serving time: the daemon hands every run over to a new
daemon in the same process (SIGUSR2 → re-exec), which adopts them (supervisor.loop.adoption).

`sglang-supervisor handover` asks the daemon found at `--url` to do it and waits until the new daemon answers
with every server back in the state it had; systemd sees the same main PID throughout (RELOADING=1, then READY=1).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from supervisor.reporting import sdnotify

POLL_S = 0.2
# systemd's watchdog from a handover's RELOADING=1 (and again from the re-exec) to the new daemon's READY=1:
# its Python start on a busy host, far longer than the unit's WatchdogSec=, which READY=1 sets again.
HANDOVER_WATCHDOG_S = 15.0


def daemon_argv(config: Path, level: str) -> list[str]:
    """The daemon's command line: exactly the installed program, whatever the working directory holds (`-P`:
    no directory of a checkout of this project is put before the installed package on `sys.path`)."""
    return [
        sys.executable,
        "-P",
        "-m",
        "supervisor.cli",
        "run",
        "--config",
        str(config),
        "--log-level",
        level,
    ]


def reexec(config: Path, level: str) -> None:
    """Replace this process with a fresh daemon on the same config (the runs are left to it)."""
    argv = daemon_argv(config, level)
    sdnotify.watchdog_for(HANDOVER_WATCHDOG_S)  # from here the new daemon's start, up to its READY=1
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, argv)


def _status(url: str) -> dict[str, Any] | None:
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/status", timeout=2) as resp:
            body = json.loads(resp.read(8 * 2**20))
    except (OSError, ValueError):
        return None
    return body if isinstance(body, dict) else None


def cmd_handover(url: str, timeout_s: float) -> int:
    """Signal the daemon at `url` to hand over, then wait for the new daemon to serve what the old one served."""
    before = _status(url)
    if before is None:
        print(f"cannot reach the supervisor at {url}", file=sys.stderr)
        return 2
    pid, started = int(before["pid"]), before.get("started_at")
    serving = {s["name"] for s in before.get("servers", []) if s.get("state") == "serving"}
    try:
        os.kill(pid, signal.SIGUSR2)
    except OSError as exc:
        print(f"cannot signal the daemon (pid {pid}): {exc.strerror}", file=sys.stderr)
        return 2
    print(f"handover asked of pid {pid}; waiting for the new daemon (at most {timeout_s:.0f} s)", flush=True)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        now = _status(url)
        if now is not None and now.get("started_at") != started:
            states = {s["name"]: s.get("state") for s in now.get("servers", [])}
            adopted = {s["name"] for s in now.get("servers", []) if s.get("adopted")}
            if all(states.get(name) == "serving" for name in serving):
                print(f"handed over: pid {now['pid']}, adopted {sorted(adopted)}, serving {sorted(serving)}")
                return 0
        time.sleep(POLL_S)
    print(f"the new daemon did not serve {sorted(serving)} within {timeout_s:.0f} s", file=sys.stderr)
    return 1
