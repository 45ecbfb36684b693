"""Port checks of a server bound to one address (`--host`) look at that address, not at 127.0.0.1."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from supervisor.config.models import ServerConfig
from supervisor.host.preflight import foreign_port_holders
from supervisor.host.release import wait_ports_free
from tests.support.ports import free_port

ADDRESS = "127.0.0.2"


@pytest.fixture
def held() -> Iterator[tuple[socket.socket, int]]:
    """A socket of this test listening on 127.0.0.2 only."""
    sock = socket.socket()
    sock.bind((ADDRESS, free_port()))
    sock.listen()
    try:
        yield sock, sock.getsockname()[1]
    finally:
        sock.close()


def _cfg(port: int) -> ServerConfig:
    return ServerConfig(name="s", command=("python",), args=("--host", ADDRESS, "--port", str(port)))


def test_a_holder_of_the_servers_address_and_port_is_named(held: tuple[socket.socket, int]) -> None:
    """A listener on the server's own address and port is a foreign holder before the launch."""
    _, port = held
    assert [h.port for h in foreign_port_holders(_cfg(port))] == [port]


def test_the_release_waits_for_the_port_at_the_servers_address(held: tuple[socket.socket, int]) -> None:
    """The port is not free while bound at `--host`, and free once closed."""
    sock, port = held
    busy = wait_ports_free(_cfg(port), deadline_s=0.1)
    assert not busy.ok and busy.busy == (port,)
    sock.close()
    assert wait_ports_free(_cfg(port), deadline_s=10).ok
