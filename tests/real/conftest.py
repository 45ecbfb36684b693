"""The `real` tier: every test here runs against the real SGLang 0.5.23, installed once into a cached venv."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.real_sglang import RealSglangError, real_sglang_python


@pytest.fixture(scope="session")
def real_python() -> Path:
    """The real SGLang venv's interpreter; the install failing fails the test (CI has the registry)."""
    try:
        return real_sglang_python()
    except RealSglangError as exc:
        pytest.fail(f"could not install the real SGLang 0.5.23: {exc}", pytrace=False)
