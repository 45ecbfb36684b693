"""The wheel tier's one fixture: the current tree built into an sdist and a wheel, installed into a clean venv."""

from __future__ import annotations

import pytest

from tests.support.wheel import Installed, ensure_installed


@pytest.fixture(scope="session")
def installed() -> Installed:
    """The product as a user installs it (built once per tree state, shared by workers through a lock)."""
    found = ensure_installed()
    if found.build_s:
        print(f"wheel smoke: built and installed {found.wheel.name} in {found.build_s:.1f}s")
    return found
