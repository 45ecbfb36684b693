"""The simulator's fault catalog."""

from __future__ import annotations

from simulator.faults import CATALOG


def test_catalog_has_the_twenty_three_scenarios() -> None:
    """The catalog names exactly the 23 fault scenarios these tests cover."""
    assert len(CATALOG) == 23
