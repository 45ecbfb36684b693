"""Fixtures of the etcd tier: a real etcd on loopback and a cuttable proxy in front of it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from tests.etcd.support import EtcdServer, Proxy


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[EtcdServer]:
    """A running etcd, stopped at teardown whatever the test did."""
    server = EtcdServer(tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
async def proxy(etcd: EtcdServer) -> AsyncIterator[Proxy]:
    """A cuttable proxy in front of the test's etcd."""
    p = Proxy(etcd.client_port)
    await p.start()
    try:
        yield p
    finally:
        await p.close()
