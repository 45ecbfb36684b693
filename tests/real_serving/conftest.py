"""The `real_serving` tier: the daemon supervising the real SGLang 0.5.23 server on CPU with tiny local models."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.real_serving.support import tiny_models
from tests.support.real_sglang import RealSglangError, real_serving_python


@pytest.fixture(scope="session")
def serving_python() -> Path:
    """The serving venv's interpreter; the install failing fails the test (CI has the registry)."""
    try:
        return real_serving_python()
    except RealSglangError as exc:
        pytest.fail(f"could not install the real SGLang 0.5.23 server: {exc}", pytrace=False)


@pytest.fixture(scope="session")
def models(serving_python: Path) -> Path:
    """The directory holding the tiny models (built once, cached beside the venvs)."""
    try:
        return tiny_models(serving_python)
    except RealSglangError as exc:
        pytest.fail(f"could not build the tiny models: {exc}", pytrace=False)
