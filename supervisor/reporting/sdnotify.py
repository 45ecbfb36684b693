"""sd_notify(3) over a plain AF_UNIX datagram socket, without libsystemd.

Under systemd (`Type=notify`) `$NOTIFY_SOCKET` names the socket: a path, or `@name` for the Linux abstract
namespace. Without it every call is a no-op returning False, so the daemon runs the same outside systemd.
A failed send is logged and returns False; it never raises into the loop.
"""

from __future__ import annotations

import os
import socket

import structlog

log = structlog.get_logger("supervisor.reporting.sdnotify")


def notify(*fields: str) -> bool:
    """Send `KEY=VALUE` fields in one datagram; True if it was sent."""
    address = os.environ.get("NOTIFY_SOCKET", "")
    if not address or address[0] not in "@/":
        return False
    target = "\0" + address[1:] if address[0] == "@" else address
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(target)
            sock.sendall("\n".join(fields).encode())
    except OSError as exc:
        log.warning("sdnotify.failed", error=exc.strerror or type(exc).__name__, fields=len(fields))
        return False
    return True


def ready(status_line: str | None = None) -> bool:
    """`READY=1`: the supervisor is up (its loop and HTTP server), not necessarily SGLang. Under a watchdog it
    also sets the unit's own `WatchdogSec=` again (`WATCHDOG_USEC=` as systemd gave it), which a handover's
    `watchdog_for` had lengthened."""
    fields = ["READY=1"]
    if watchdog_interval_s() is not None:
        fields += ["WATCHDOG=1", f"WATCHDOG_USEC={os.environ['WATCHDOG_USEC']}"]
    if status_line is not None:
        fields.append(_status(status_line))
    return notify(*fields)


def watchdog() -> bool:
    """`WATCHDOG=1`: the supervisor loop is alive; send it every `watchdog_interval_s()`."""
    return notify("WATCHDOG=1")


def watchdog_for(seconds: float) -> bool:
    """`WATCHDOG=1` and `WATCHDOG_USEC=`: the next `watchdog()` may come `seconds` from now, not within the unit's
    `WatchdogSec=` (a handover: the re-executed daemon pings again only once it is up). No-op without a watchdog."""
    if watchdog_interval_s() is None:
        return False
    return notify("WATCHDOG=1", f"WATCHDOG_USEC={int(seconds * 1e6)}")


def status(line: str) -> bool:
    """`STATUS=<line>`: one line of state, shown by `systemctl status`."""
    return notify(_status(line))


def stopping() -> bool:
    """`STOPPING=1`: the supervisor is draining and stopping its servers."""
    return notify("STOPPING=1")


def watchdog_interval_s() -> float | None:
    """How often to send `watchdog()`: half of `WATCHDOG_USEC`, or None when the watchdog is off.

    None also when `WATCHDOG_PID` is set and names another process (the watchdog is not ours).
    """
    usec = os.environ.get("WATCHDOG_USEC", "")
    pid = os.environ.get("WATCHDOG_PID", "")
    try:
        if not usec or int(usec) <= 0 or (pid and int(pid) != os.getpid()):
            return None
        return int(usec) / 2e6
    except ValueError:
        return None


def _status(line: str) -> str:
    return "STATUS=" + " ".join(line.split())
