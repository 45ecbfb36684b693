"""A test's tier is the folder it lives in: tests/<tier>/ marks every test there with the `<tier>` marker.

A test outside a tier folder, or marked with another tier than its folder's, stops the run, so `-m unit`
always selects exactly tests/unit/. A new tier is a folder plus its marker registered in pyproject.toml.
Tiers run slowest first (the order of TIERS; the real tier's fixtures import real SGLang for a minute),
so parallel workers (`make test`) take the long waits first and finish together. The real-serving tier runs after the others, in one process (`make test`): its real servers
would starve each other on two cores.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.treewatch import VIOLATIONS

TESTS = Path(__file__).resolve().parent
TIERS = (
    "systemd",
    "monitoring",
    "real",
    "wheel",
    "container",
    "gateway",
    "e2e",
    "real_serving",
    "real_pd",
    "etcd",
    "hardening",
    "process",
    "unit",
)


def tier_of(path: Path) -> str | None:
    """The tier folder a test file sits in (None outside tests/<tier>/)."""
    parts = path.resolve().relative_to(TESTS).parts
    return parts[0] if len(parts) > 1 and parts[0] in TIERS else None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark each test with its folder's tier, slowest tier first; refuse a test outside its tier."""
    for item in items:
        tier = tier_of(item.path)
        if tier is None:
            raise pytest.UsageError(
                f"{item.nodeid}: tests live in a tier folder, tests/{{{','.join(TIERS)}}}/"
            )
        other = sorted({m.name for m in item.iter_markers() if m.name in TIERS} - {tier})
        if other:
            raise pytest.UsageError(f"{item.nodeid} is marked {other} but lives in tests/{tier}/")
        item.add_marker(getattr(pytest.mark, tier))
    items.sort(key=lambda item: TIERS.index(tier_of(item.path) or TIERS[-1]))


@pytest.fixture(autouse=True)
def one_tree_at_a_time() -> Iterator[None]:
    """Every test that runs a daemon over a deployment (tests/support/daemon.py) is held to the supervisor's
    invariants, watched from outside: two runs of one server never live at once, and nothing is left after a
    graceful stop. A deployment's cleanup records what broke; this fails the test at teardown."""
    VIOLATIONS.clear()
    yield
    found = list(VIOLATIONS)
    VIOLATIONS.clear()
    if found:
        pytest.fail("the supervisor's invariants broke:\n" + "\n".join(found))
