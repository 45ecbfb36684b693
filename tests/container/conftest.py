"""The container tier needs root and PID namespaces; everything else it installs itself (the wheel, nspawn)."""

from __future__ import annotations

import pytest

from tests.support.nspawn import unavailable
from tests.support.wheel import Installed, ensure_installed


@pytest.fixture(scope="session")
def installed() -> Installed:
    """The wheel built from this tree, installed without extras into a clean venv."""
    why = unavailable()
    if why is not None:
        pytest.skip(why)
    return ensure_installed()
