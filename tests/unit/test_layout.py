"""The package layout the design promises, and a tests/ tree whose folders are the tiers."""

from __future__ import annotations

import importlib
import re
import tomllib

import pytest

from tests.conftest import TIERS
from tests.support.paths import REPO, TESTS

SHARED_HELPERS = ("free_port", "wait_for", "wait_until", "poll", "holders", "launched_sim", "deployment")


@pytest.mark.parametrize("name", ["supervisor", "probes", "policies", "simulator"])
def test_packages_import(name: str) -> None:
    """Every top-level package of the distribution imports."""
    assert importlib.import_module(name) is not None


def test_every_test_file_sits_in_a_registered_tier_folder() -> None:
    """tests/<tier>/test_*.py only, each tier a package with its marker registered in pyproject.toml."""
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    registered = {line.split(":", 1)[0] for line in pyproject["tool"]["pytest"]["ini_options"]["markers"]}
    assert set(TIERS) <= registered, set(TIERS) - registered
    for path in TESTS.rglob("test_*.py"):
        folder = path.relative_to(TESTS).parts[0]
        assert folder in TIERS and len(path.relative_to(TESTS).parts) == 2, f"{path} is outside a tier folder"
        assert (path.parent / "__init__.py").exists(), f"{path.parent} needs an __init__.py"


def test_shared_helpers_are_defined_once_in_tests_support() -> None:
    """Ports, deadline polls, process scans and launchers live in tests/support/, not again in a test module."""
    pattern = re.compile(rf"^(?:async )?def ({'|'.join(SHARED_HELPERS)})\(", re.MULTILINE)
    support = TESTS / "support"
    copies = [
        f"{path.relative_to(REPO)}: {name}"
        for path in TESTS.rglob("*.py")
        if support not in path.parents
        for name in pattern.findall(path.read_text())
    ]
    assert not copies, copies
