"""The container tier: the installed wheel as PID 1 of a PID namespace, and the shipped Dockerfile built and run by
real engines (tests/container/engines.py), Debian's docker.io and podman, each a parameter of the `engine` fixture.

One dockerd and one podman storage serve the whole session (its tests run in one pytest process, in file order:
`make test`'s SERIAL_TIERS), each image is built once, and containers are shared by the tests that do not disturb
each other. Without root, or where the engines cannot be installed, the engine tests are skipped with the reason.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.container.engines import Engine, ensure_packages, podman, start_docker
from tests.container.image import build
from tests.container.running import FIGURES, record
from tests.support.tools import CACHE
from tests.support.wheel import Installed, ensure_installed

ENGINES = ("docker", "podman")


@pytest.fixture(scope="session")
def installed() -> Installed:
    """The wheel built from this tree, installed without extras into a clean venv."""
    if os.geteuid() != 0:
        pytest.skip("PID namespaces need root")
    return ensure_installed()


@pytest.fixture(scope="session", params=ENGINES)
def engine(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    """A real engine of the session's own, its storage in a private folder, with the image built in it."""
    why = ensure_packages(CACHE / "engines.lock")
    if why is not None:
        pytest.skip(why)
    name = str(request.param)
    root = tmp_path_factory.mktemp(name)
    wheel = ensure_installed().wheel
    engine = start_docker(root) if name == "docker" else podman(root)
    try:
        record(f"{name}: build of the shipped Dockerfile", f"{build(engine, wheel, root / 'context'):.1f} s")
        yield engine
    finally:
        engine.close()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The figures the tier measured (builds, starts, adoption gaps, stops), one per line."""
    if FIGURES:
        terminalreporter.section("container tier figures")
        for name, value in FIGURES.items():
            terminalreporter.write_line(f"{name}: {value}")
