"""The supervisor as a container's PID 1: a minimal init that reaps every process and keeps the daemon running.

`sglang-supervisor run` started as PID 1 (a container's entrypoint without `--init`, a pod's container) does not
run the daemon in PID 1 itself. PID 1's death ends its whole PID namespace, so a crash of a daemon that was
PID 1 would take SGLang with it and cost a full model load; instead PID 1 stays this small loop (the standard
library only, no event loop, nothing of the daemon's), and the daemon runs as its child:

- every process of the namespace that is re-parented to PID 1 is reaped here, its exit status logged
  (`init.reaped`);
- SIGTERM, SIGINT, SIGHUP and SIGUSR2 are passed to the daemon (stop and drain, reload, handover); nothing else
  is forwarded;
- a daemon that dies by a signal or with a failure status is started again after `RESTART_S` and adopts the
  servers, which kept serving (as systemd's `Restart=` does on a host), at most `BURST` times in `WINDOW_S`; a
  config error (exit 78), a status port taken (exit 69: in a container nothing of ours can still hold it, so a
  retry would fail the same way) or a clean exit ends the container with that status;
- once the daemon has exited for good, whatever is left in the namespace is killed and reaped before PID 1
  exits, and said (`init.leftover`).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from collections import deque
from collections.abc import Sequence
from datetime import UTC, datetime

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR2)
STOPPING = (signal.SIGTERM, signal.SIGINT)
WATCHED = (*FORWARDED, signal.SIGCHLD)
EX_CONFIG = 78
EX_UNAVAILABLE = 69  # the daemon's status port is taken
FINAL = {
    EX_CONFIG: "the config is invalid",
    EX_UNAVAILABLE: "the status port is taken (daemon.status_bind_failed)",
}
RESTART_S = 1.0
BURST, WINDOW_S = 5, 600.0
_WAIT_S = 1.0


def _log(event: str, **fields: object) -> None:
    """One JSON line on stderr, in the daemon's own form (`event`, `level`, `timestamp`), in one write: the
    daemon writes to the same pipe, and a line written in two parts could be split by one of its lines."""
    stamp = datetime.now(UTC).isoformat().replace("+00:00", "Z")
    sys.stderr.write(json.dumps({"event": event, "level": "info", "timestamp": stamp, **fields}) + "\n")
    sys.stderr.flush()


def _spawn(argv: Sequence[str]) -> int:
    """The daemon as our child, with the signal mask and dispositions a fresh process has."""
    return os.posix_spawn(argv[0], list(argv), dict(os.environ), setsigmask=(), setsigdef=WATCHED)


def _reap() -> list[tuple[int, int]]:
    """Every child that has exited: (pid, status as `waitstatus_to_exitcode` gives it)."""
    done: list[tuple[int, int]] = []
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return done
        if pid == 0:
            return done
        done.append((pid, os.waitstatus_to_exitcode(status)))


def _has_children() -> bool:
    try:
        os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return False
    return True


def _finish(code: int) -> int:
    """Kill and reap what is left in the namespace (nothing, after a clean stop), then PID 1's status."""
    left: list[tuple[int, int]] = []
    with contextlib.suppress(ProcessLookupError):
        os.kill(-1, signal.SIGKILL)  # from PID 1: every other process of the namespace
    deadline = time.monotonic() + 10.0
    while _has_children() and time.monotonic() < deadline:
        left += _reap()
        time.sleep(0.05)
    left += _reap()
    if left:
        _log("init.leftover", killed=[pid for pid, _ in left], hint="processes outlived the daemon's stop")
    code = code if code >= 0 else 128 - code  # killed by signal N: 128 + N, as a shell reports it
    _log("init.exit", status=code)
    return code


def run(argv: Sequence[str]) -> int:
    """Be PID 1 for the daemon `argv` (an absolute program first) until it exits for good; its status."""
    signal.pthread_sigmask(signal.SIG_BLOCK, WATCHED)
    starts: deque[float] = deque(maxlen=BURST)
    stopping = False
    daemon = _start(argv, starts)
    restart_at: float | None = None
    last = 0
    while True:
        wait = _WAIT_S if restart_at is None else max(0.0, min(_WAIT_S, restart_at - time.monotonic()))
        info = signal.sigtimedwait(WATCHED, wait)
        if info is not None and info.si_signo != signal.SIGCHLD:
            stopping = stopping or info.si_signo in STOPPING
            if daemon:
                _forward(daemon, signal.Signals(info.si_signo))
        for pid, status in _reap():
            if pid != daemon:
                _log("init.reaped", child=pid, status=status)
                continue
            daemon, last = 0, status
            _log("init.daemon_exited", status=status, stopping=stopping)
            if status in FINAL:
                _log("init.daemon_failed", status=status, hint=f"{FINAL[status]}: not restarted")
            if stopping or status == 0 or status in FINAL:
                return _finish(status)
            if len(starts) == BURST and time.monotonic() - starts[0] < WINDOW_S:
                _log("init.start_limit", starts=BURST, window_s=WINDOW_S, hint="the daemon keeps failing")
                return _finish(status or 1)
            restart_at = time.monotonic() + RESTART_S
        if not daemon and stopping:
            return _finish(last)
        if restart_at is not None and time.monotonic() >= restart_at:
            restart_at = None
            daemon = _start(argv, starts)


def _start(argv: Sequence[str], starts: deque[float]) -> int:
    starts.append(time.monotonic())
    pid = _spawn(argv)
    _log("init.daemon_started", daemon=pid)
    return pid


def _forward(pid: int, sig: signal.Signals) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return
    _log("init.forwarded", signal=sig.name, daemon=pid)
