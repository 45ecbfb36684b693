"""sd_notify over a real AF_UNIX datagram socket: path and abstract addresses, no-op without systemd."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from supervisor.reporting import sdnotify


@pytest.fixture
def listener(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[socket.socket]:
    """A datagram socket at a filesystem path, named by NOTIFY_SOCKET."""
    path = tmp_path / "notify.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(path))
        sock.settimeout(5)
        monkeypatch.setenv("NOTIFY_SOCKET", str(path))
        yield sock


def test_every_message_arrives_as_one_datagram(listener: socket.socket) -> None:
    """ready, status, watchdog and stopping each send the documented KEY=VALUE datagram."""
    assert sdnotify.ready("supervisor up; 2 servers starting")
    assert sdnotify.status("decode: recovering\n(rung 1)")
    assert sdnotify.watchdog()
    assert sdnotify.stopping()
    received = [listener.recv(4096) for _ in range(4)]
    assert received == [
        b"READY=1\nSTATUS=supervisor up; 2 servers starting",
        b"STATUS=decode: recovering (rung 1)",
        b"WATCHDOG=1",
        b"STOPPING=1",
    ]


def test_abstract_socket_address(monkeypatch: pytest.MonkeyPatch) -> None:
    """An `@name` NOTIFY_SOCKET reaches the abstract-namespace socket."""
    name = f"sglsup-test-{os.getpid()}-{id(monkeypatch)}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        sock.settimeout(5)
        monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
        assert sdnotify.ready()
        assert sock.recv(4096) == b"READY=1"


def test_no_socket_is_a_no_op(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without NOTIFY_SOCKET every call returns False and does nothing."""
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert not sdnotify.ready()
    assert not sdnotify.watchdog()


def test_missing_socket_returns_false(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A NOTIFY_SOCKET that nobody listens on is reported, not raised."""
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "gone.sock"))
    assert not sdnotify.watchdog()


@pytest.mark.parametrize(
    ("usec", "pid", "expected"),
    [
        ("30000000", None, 15.0),
        ("30000000", "self", 15.0),
        ("30000000", "1", None),
        (None, None, None),
        ("0", None, None),
        ("nonsense", None, None),
    ],
)
def test_watchdog_interval_is_half_of_watchdog_usec(
    monkeypatch: pytest.MonkeyPatch, usec: str | None, pid: str | None, expected: float | None
) -> None:
    """The ping interval is WATCHDOG_USEC/2, and None when off, invalid or meant for another PID."""
    for name, value in (("WATCHDOG_USEC", usec), ("WATCHDOG_PID", pid)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, str(os.getpid()) if value == "self" else value)
    assert sdnotify.watchdog_interval_s() == expected


def test_a_handover_lengthens_the_watchdog_and_ready_sets_the_units_own_again(
    listener: socket.socket, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under a 3 s watchdog, `watchdog_for(15)` allows 15 s to the next ping and READY=1 sets 3 s again."""
    monkeypatch.setenv("WATCHDOG_USEC", "3000000")
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    assert sdnotify.watchdog_for(15.0)
    assert sdnotify.ready("serving: sim=serving")
    assert [listener.recv(4096) for _ in range(2)] == [
        b"WATCHDOG=1\nWATCHDOG_USEC=15000000",
        b"READY=1\nWATCHDOG=1\nWATCHDOG_USEC=3000000\nSTATUS=serving: sim=serving",
    ]
    monkeypatch.delenv("WATCHDOG_USEC")
    assert not sdnotify.watchdog_for(15.0), "no watchdog: nothing to lengthen"
