"""Free loopback ports for servers a test starts (each test asks for its own, so parallel workers never clash)."""

from __future__ import annotations

import socket

_ATTEMPTS = 200


def free_port(span: int = 1) -> int:
    """A port p of 127.0.0.1 such that p .. p+span-1 were all free a moment ago.

    The simulator binds rpc ports at p+2 and up, so a simulated server asks for a span of 3 or 4.
    """
    for _ in range(_ATTEMPTS):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port + span < 65000 and all(_bindable(p) for p in range(port + 1, port + span)):
            return port
    raise RuntimeError(f"no block of {span} free ports found")


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True
