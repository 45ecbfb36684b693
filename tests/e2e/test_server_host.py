"""A server bound to one address (`--host`) is probed there and reaches serving, IPv4 or IPv6."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from tests.support.daemon import deployment


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as sock:
            sock.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.parametrize(
    "host",
    [
        "127.0.0.2",
        pytest.param(
            "::1",
            marks=pytest.mark.skipif(
                not _ipv6_loopback(), reason="this machine cannot bind the IPv6 loopback ::1"
            ),
        ),
    ],
)
def test_a_server_bound_to_its_host_reaches_serving(tmp_path: Path, host: str) -> None:
    """`--host` other than 127.0.0.1: the probes go to that address and the server serves."""
    with deployment(tmp_path, extra_args=["--host", host]) as dep:
        dep.start()
        s = dep.wait(lambda s: s.get("state") == "serving", what=f"serving on {host}")
        assert s["restarts"] == 0 and s["last_incident"] is None
