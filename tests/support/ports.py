"""Free loopback ports for servers a test starts, chosen so that nothing else can take them before the server binds.

A port the kernel hands out for `bind(("127.0.0.1", 0))` lies in the ephemeral range, where every outgoing
connection of every test also gets its source port: between the check and the server's own bind, any client on
the machine could take it (CI saw a simulator fail to bind that way). So ports come from below the ephemeral
range, where the kernel never assigns one on its own, and each pytest-xdist worker draws from its own slice of
that pool, so parallel workers never hand out the same port either (a run beside them takes the slice
`SGLSUP_TEST_PORT_SLICE` names). Each port is still checked free before use:
servers a test left behind, or another run on the machine, only make the allocator skip ahead.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

_POOL_LOW = 10000
_SLICES = 16
_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = (int(x) for x in _RANGE_FILE.read_text().split())
    except (OSError, ValueError):
        return 32768, 60999
    return low, high


def _slice() -> range:
    """This worker's ports: one sixteenth of the ports between 10000 and the ephemeral range (or above it)."""
    low, high = _ephemeral_range()
    start, stop = (_POOL_LOW, low) if low - _POOL_LOW >= 4096 else (high + 1, 65000)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    # A pytest run beside the parallel workers (make test's serial tiers) names its own slice.
    worker = os.environ.get("SGLSUP_TEST_PORT_SLICE", worker)
    index = int(worker) % _SLICES if worker.isdigit() else 0
    size = (stop - start) // _SLICES
    return range(start + index * size, start + (index + 1) * size)


_PORTS = _slice()
_cursor = [os.getpid() % len(_PORTS)]


def free_port(span: int = 1) -> int:
    """A port p of 127.0.0.1 such that p .. p+span-1 are free now and were not handed out recently by this worker.

    The simulator binds rpc ports at p+2 and up, so a simulated server asks for a span of 3 or 4.
    """
    for _ in range(len(_PORTS)):
        if _cursor[0] + span > len(_PORTS):
            _cursor[0] = 0
        port = _PORTS[_cursor[0]]
        _cursor[0] += span
        if all(_bindable(p) for p in range(port, port + span)):
            return port
    raise RuntimeError(f"no block of {span} free ports left in {_PORTS}")


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True
