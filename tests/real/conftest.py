"""The `real` tier: every test here runs against the real SGLang 0.5.23, installed once into a cached venv."""

from __future__ import annotations

from pathlib import Path

import pytest
from real_sglang import RealSglangError, real_sglang_python

_HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test under tests/real as `real`."""
    for item in items:
        if _HERE in item.path.parents:
            item.add_marker(pytest.mark.real)


@pytest.fixture(scope="session")
def real_python() -> Path:
    """The real SGLang venv's interpreter; the install failing fails the test (CI has the registry)."""
    try:
        return real_sglang_python()
    except RealSglangError as exc:
        pytest.fail(f"could not install the real SGLang 0.5.23: {exc}", pytrace=False)
