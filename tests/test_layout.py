"""The package layout the design promises."""

import importlib

import pytest


@pytest.mark.unit
@pytest.mark.parametrize("name", ["supervisor", "probes", "policies", "simulator"])
def test_packages_import(name: str) -> None:
    """Every top-level package of the distribution imports."""
    assert importlib.import_module(name) is not None
