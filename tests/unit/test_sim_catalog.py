"""The simulator's fault catalog."""

from __future__ import annotations

from simulator.faults import CATALOG


def test_catalog_has_the_twenty_one_scenarios() -> None:
    """The catalog names exactly the 21 fault scenarios these tests cover."""
    assert len(CATALOG) == 21
