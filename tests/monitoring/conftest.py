"""The monitoring tier's one world, shared by its tests in file order: the installed daemon over a host with a
server per alert cause, every cause injected at the start, a real Prometheus and Alertmanager watching it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.monitored import World, monitored_world


@pytest.fixture(scope="session")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    """Everything started once for the tier (tests/support/monitored.py) and stopped after its last test."""
    with monitored_world(tmp_path_factory.mktemp("monitoring")) as started:
        yield started
