"""monitoring/alerts.yaml is complete for on-call: every alert labelled, documented and unit-tested."""

from __future__ import annotations

import re

from tests.support.monitoring import EXPECTED_ALERTS, RULE_TESTS, RULES


def alert_blocks() -> dict[str, str]:
    """Each alert's name and the YAML text of its rule."""
    parts = re.split(r"^\s*- alert: ", RULES.read_text(), flags=re.MULTILINE)[1:]
    return {part.split("\n", 1)[0].strip(): part for part in parts}


def test_every_alert_has_severity_summary_description_and_runbook_anchor() -> None:
    """Each alert carries severity, summary, description and runbook_url = runbook.md#<AlertName>."""
    blocks = alert_blocks()
    assert set(blocks) == EXPECTED_ALERTS
    for name, block in blocks.items():
        assert re.search(r"severity: (critical|warning)\n", block), name
        assert "summary: " in block and "description: " in block, name
        assert f"runbook_url: runbook.md#{name}\n" in block, name


def test_every_alert_has_a_firing_unit_test() -> None:
    """alerts_test.yaml expects every alert to fire at least once."""
    text = RULE_TESTS.read_text()
    for name in EXPECTED_ALERTS:
        assert re.search(rf"alertname: {name}\n\s+exp_alerts:\n\s+- exp_labels:", text), name
