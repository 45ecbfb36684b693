"""policies/ stays pure: no module imports anything that does I/O or reads the clock, nor probes or supervisor."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.support.paths import REPO

BANNED = {
    "asyncio",
    "os",
    "subprocess",
    "time",
    "aiohttp",
    "psutil",
    "socket",
    "signal",
    "probes",
    "supervisor",
}
MODULES = sorted((REPO / "policies").glob("*.py"))


@pytest.mark.parametrize("path", MODULES, ids=[p.name for p in MODULES])
def test_policy_module_imports_nothing_impure(path: Path) -> None:
    """A policies module imports none of the I/O modules, and neither `probes` nor `supervisor`."""
    imported: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            imported |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module.split(".")[0])
    assert not imported & BANNED
