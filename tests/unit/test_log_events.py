"""Every log event the daemon emits is documented in docs/contracts.md (names in code = names in the docs)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[2]
LEVELS = {"debug", "info", "warning", "error", "exception", "critical"}


def _events() -> dict[str, str]:
    """Event name → a file that logs it, for every structlog call with a dotted literal event."""
    found: dict[str, str] = {}
    for package in ("supervisor", "probes"):
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                    continue
                if node.func.attr not in LEVELS or not node.args:
                    continue
                first = node.args[0]
                literal = isinstance(first, ast.Constant) and isinstance(first.value, str)
                if literal and re.fullmatch(r"[a-z_]+\.[a-z_.]+", str(first.value)):
                    found[str(first.value)] = str(path.relative_to(ROOT))
    return found


def test_every_logged_event_is_documented() -> None:
    """A new log event without a line in docs/contracts.md fails here."""
    contracts = (ROOT / "docs" / "contracts.md").read_text()
    section = contracts.split("## Log events", 1)[1]
    documented = set(re.findall(r"`([a-z_]+\.[a-z_.]+)`", section))
    events = _events()
    assert len(events) > 20
    missing = {name: where for name, where in events.items() if name not in documented}
    assert not missing, missing
