"""Where things are: the repository root and the tests' data, whatever folder a test lives in."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TESTS = REPO / "tests"
DATA = TESTS / "data"
CONFIGS = TESTS / "configs"
