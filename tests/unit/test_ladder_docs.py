"""Every ladder key of the code's default table is documented in docs/config.md and runbook.md."""

from __future__ import annotations

import re

import pytest

from policies.ladders import DEFAULT_LADDERS
from tests.support.paths import REPO

pytestmark = pytest.mark.unit


def _table_keys(text: str, start: str, end: str) -> set[str]:
    """The `key`s named in the first column of the table rows between `start` and `end`."""
    section = text.split(start, 1)[1].split(end, 1)[0]
    rows = [line.split("|")[1] for line in section.splitlines() if line.startswith("|")]
    return {key for cell in rows for key in re.findall(r"`([a-z_]+(?::[a-z0-9_]+)?)`", cell)}


def test_every_default_ladder_key_is_in_the_config_reference() -> None:
    """docs/config.md's default-ladders table names each key of DEFAULT_LADDERS."""
    text = (REPO / "docs" / "config.md").read_text()
    documented = _table_keys(text, "Default ladders:", "\n## ")
    assert sorted(set(DEFAULT_LADDERS) - documented) == []


def test_every_default_ladder_key_is_in_the_runbook() -> None:
    """runbook.md's fallback-flags table names each key of DEFAULT_LADDERS."""
    text = (REPO / "runbook.md").read_text()
    documented = _table_keys(text, '<a id="fallback-flags"></a>', "<a id=")
    assert sorted(set(DEFAULT_LADDERS) - documented) == []
