"""The systemd tier's one container: systemd 252 booted once, the product installed as the README says.

Its tests run in file order against the same unit, numbered after the points they prove: each
starts with the start limit's count at zero (`systemctl reset-failed`) and must leave the server serving.
The tier needs root and `systemd-nspawn` (extracted from Debian's package); without them it is skipped.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator

import pytest

from tests.support.nspawn import unavailable
from tests.support.wheel import ensure_installed, wheelhouse
from tests.systemd.machine import CONFIG, FIGURES, FILES, HERE, UNIT, Machine
from tests.systemd.wheels import renumbered

NEWER = "post1"  # the upgrade test installs VERSION.post1 over VERSION


@pytest.fixture(scope="session")
def machine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Machine]:
    """The booted container with the wheel installed, the unit installed but not started yet."""
    why = unavailable()
    if why is not None:
        pytest.skip(why)
    installed = ensure_installed()
    files = tmp_path_factory.mktemp("systemd-files")
    shutil.copy(installed.wheel, files)
    renumbered(installed.wheel, f"{installed.version}.{NEWER}", files)
    shutil.copy(HERE / "config.toml", files)
    for script in (HERE / "inside").glob("*.py"):
        shutil.copy(script, files)
    started = time.monotonic()
    host = Machine.boot(
        tmp_path_factory.mktemp("systemd-container"), files, wheelhouse(installed.wheel), installed.wheel.name
    )
    try:
        host.record("container boot", f"{time.monotonic() - started:.1f} s")
        host.record("install (venv, pip, user, install-unit, config)", f"{host.install():.1f} s")
        yield host
    finally:
        host.close()


@pytest.fixture(autouse=True)
def unit_left_serving(machine: Machine) -> Iterator[None]:
    """Each test starts with a fresh start-limit count and leaves the server serving for the next one (a test
    that failed with the unit down or its config changed gets both back, so the next test does not fail for it)."""
    machine.reset()
    yield
    if machine.prop("ActiveState") not in ("active", "reloading"):
        machine.reset()
        machine.sh(f"install -m 0644 -g sglang {FILES}/config.toml {CONFIG} && systemctl start {UNIT}")
    machine.wait_serving()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The figures the tier measured (start, gaps after a crash and a watchdog abort, stop), one per line."""
    if FIGURES:
        terminalreporter.section("systemd tier figures")
        for name, value in FIGURES.items():
            terminalreporter.write_line(f"{name}: {value}")
