"""The monitoring bundle and the metrics render, checked by the real `promtool` (rules, rule tests, exposition)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.support.monitoring import (
    EXPECTED_ALERTS,
    RULE_TESTS,
    RULES,
    concrete,
    populated,
    promtool,
    targets,
)


def output(result: subprocess.CompletedProcess[bytes]) -> str:
    """promtool's stdout and stderr as text."""
    return (result.stdout + result.stderr).decode()


def test_promtool_check_rules_with_all_lints_is_clean() -> None:
    """`promtool check rules --lint=all --lint-fatal` accepts every rule."""
    result = promtool("check", "rules", "--lint=all", "--lint-fatal", str(RULES))
    assert result.returncode == 0, output(result)
    assert f"SUCCESS: {len(EXPECTED_ALERTS)} rules found" in result.stdout.decode()


def test_promtool_rule_unit_tests_pass() -> None:
    """`promtool test rules alerts_test.yaml` passes: each alert fires, and only when it should."""
    result = promtool("test", "rules", str(RULE_TESTS))
    assert result.returncode == 0, output(result)
    assert "SUCCESS" in result.stdout.decode()


def test_promtool_rejects_a_broken_rule(tmp_path: Path) -> None:
    """The check has teeth: a rule with an unparsable expression fails promtool."""
    broken = tmp_path / "broken.yaml"
    broken.write_text(RULES.read_text().replace("== 0", "== (0", 1))
    result = promtool("check", "rules", str(broken))
    assert result.returncode != 0
    assert "parse error" in output(result)


def test_every_dashboard_expression_parses_with_promtool(tmp_path: Path) -> None:
    """Each dashboard target expression, as a recording rule, passes `promtool check rules`."""
    rules = tmp_path / "dashboard-rules.yaml"
    lines = ["groups:", "  - name: dashboard-exprs", "    rules:"]
    for panel_id, ref_id, expr in targets():
        lines.append(f"      - record: dashboard:panel{panel_id}_{ref_id}:check")
        lines.append(f"        expr: {json.dumps(concrete(expr))}")
    rules.write_text("\n".join(lines) + "\n")
    result = promtool("check", "rules", str(rules))
    assert result.returncode == 0, output(result)
    assert f"SUCCESS: {len(targets())} rules found" in result.stdout.decode()


def test_promtool_check_metrics_is_clean() -> None:
    """`promtool check metrics` finds no problem in a populated render."""
    result = promtool("check", "metrics", stdin=populated().render())
    assert result.returncode == 0, output(result)
    assert result.stdout.strip() == b"" and result.stderr.strip() == b""
