"""monitoring/alerts.yaml: valid for the real promtool, unit-tested by it, and complete for on-call."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from tools import ensure_promtool

MONITORING = Path(__file__).resolve().parent.parent / "monitoring"
RULES = MONITORING / "alerts.yaml"
RULE_TESTS = MONITORING / "alerts_test.yaml"
EXPECTED_ALERTS = {
    "SglangSupervisorDown",
    "SglangSupervisorAbsent",
    "SglangServerDown",
    "SglangServerFailed",
    "SglangServerCrashLoop",
    "SglangWedgeDetected",
    "SglangParserMisconfigured",
    "SglangServerDegraded",
    "SglangGpuFault",
    "SglangCanaryUnproven",
    "SglangSupervisorAlertDeliveryFailing",
    "SglangGroupStuckInBarrier",
    "SglangGroupEtcdUnreachable",
}


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    """Run promtool with a timeout, capturing its output."""
    return subprocess.run(
        [str(ensure_promtool()), *args], capture_output=True, text=True, timeout=120, check=False
    )


def alert_blocks() -> dict[str, str]:
    """Each alert's name and the YAML text of its rule."""
    parts = re.split(r"^\s*- alert: ", RULES.read_text(), flags=re.MULTILINE)[1:]
    return {part.split("\n", 1)[0].strip(): part for part in parts}


@pytest.mark.process
def test_promtool_check_rules_with_all_lints_is_clean() -> None:
    """`promtool check rules --lint=all --lint-fatal` accepts every rule."""
    result = promtool("check", "rules", "--lint=all", "--lint-fatal", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(EXPECTED_ALERTS)} rules found" in result.stdout


@pytest.mark.process
def test_promtool_rule_unit_tests_pass() -> None:
    """`promtool test rules alerts_test.yaml` passes: each alert fires, and only when it should."""
    result = promtool("test", "rules", str(RULE_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


@pytest.mark.unit
def test_every_alert_has_severity_summary_description_and_runbook_anchor() -> None:
    """Each alert carries severity, summary, description and runbook_url = runbook.md#<AlertName>."""
    blocks = alert_blocks()
    assert set(blocks) == EXPECTED_ALERTS
    for name, block in blocks.items():
        assert re.search(r"severity: (critical|warning)\n", block), name
        assert "summary: " in block and "description: " in block, name
        assert f"runbook_url: runbook.md#{name}\n" in block, name


@pytest.mark.unit
def test_every_alert_has_a_firing_unit_test() -> None:
    """alerts_test.yaml expects every alert to fire at least once."""
    text = RULE_TESTS.read_text()
    for name in EXPECTED_ALERTS:
        assert re.search(rf"alertname: {name}\n\s+exp_alerts:\n\s+- exp_labels:", text), name


@pytest.mark.process
def test_promtool_rejects_a_broken_rule(tmp_path: Path) -> None:
    """The check has teeth: a rule with an unparsable expression fails promtool."""
    broken = tmp_path / "broken.yaml"
    broken.write_text(RULES.read_text().replace("== 0", "== (0", 1))
    result = promtool("check", "rules", str(broken))
    assert result.returncode != 0
    assert "parse error" in result.stdout + result.stderr
