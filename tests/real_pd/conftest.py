"""The `real_pd` tier: the daemon supervising the real SGLang 0.5.23 prefill and decode on CPU, the KV moved by the
Mooncake transfer engine over TCP, behind the real SMG in PD mode."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.real_serving.support import tiny_models
from tests.support.real_pd import real_pd_python
from tests.support.real_sglang import RealSglangError


@pytest.fixture(scope="session")
def pd_python() -> Path:
    """The PD venv's interpreter (serving venv + Mooncake); the install failing fails the test."""
    try:
        return real_pd_python()
    except RealSglangError as exc:
        pytest.fail(f"could not install the real PD pair's pieces: {exc}", pytrace=False)


@pytest.fixture(scope="session")
def models(pd_python: Path) -> Path:
    """The tiny models (built once, cached beside the venvs)."""
    try:
        return tiny_models(pd_python)
    except RealSglangError as exc:
        pytest.fail(f"could not build the tiny models: {exc}", pytrace=False)
