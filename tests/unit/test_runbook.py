"""runbook.md matches the code: alerts, fault kinds, states, CLI commands and metric names."""

from __future__ import annotations

import argparse
import re
import shlex

from policies.states import FaultKind, ServerState
from supervisor.cli import _parser
from supervisor.reporting.metrics import ServerGauges, SupervisorMetrics
from tests.support.paths import REPO

ROOT = REPO
RUNBOOK = (ROOT / "runbook.md").read_text()
ALERTS_YAML = (ROOT / "monitoring" / "alerts.yaml").read_text()
ALERT_NAMES = re.findall(r"^\s*- alert: (\S+)$", ALERTS_YAML, re.MULTILINE)
RUNBOOK_URLS = re.findall(r"^\s*runbook_url: (\S+)$", ALERTS_YAML, re.MULTILINE)
ANCHORS = set(re.findall(r'<a id="([^"]+)"></a>', RUNBOOK))
COMMAND = "sglang-supervisor"


def _sections() -> dict[str, str]:
    """Anchor → the text from it to the next anchor."""
    parts = re.split(r'<a id="([^"]+)"></a>', RUNBOOK)
    return {parts[i]: parts[i + 1] for i in range(1, len(parts) - 1, 2)}


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = _parser()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    raise AssertionError("supervisor.cli has no subcommands")


def _code_lines() -> list[str]:
    """Lines of fenced code blocks that run the CLI, without comments, pipes or chained commands."""
    lines = []
    for block in re.findall(r"```(?:bash)?\n(.*?)```", RUNBOOK, re.DOTALL):
        for line in block.splitlines():
            text = line.split(" #", 1)[0].split(" | ", 1)[0].split(";", 1)[0].strip()
            if text.startswith(COMMAND + " "):
                lines.append(text)
    return lines


def _mentioned_subcommands() -> set[str]:
    """Subcommands named as `sglang-supervisor X` in code blocks and inline code (`a|b|c` counts each)."""
    inline = re.findall(r"`" + COMMAND + r" ([a-z|-]+)", RUNBOOK)
    blocks = [line.split()[1] for line in _code_lines()]
    return {name for group in inline + blocks for name in group.split("|") if name}


def test_every_alert_has_its_section() -> None:
    """Each alert of monitoring/alerts.yaml has an anchor and a heading named exactly after it."""
    assert len(ALERT_NAMES) == 15
    for name in ALERT_NAMES:
        assert name in ANCHORS, name
        assert f"## {name}\n" in RUNBOOK, name


def test_every_runbook_url_anchor_exists() -> None:
    """Every runbook_url of alerts.yaml points into runbook.md at an anchor that exists."""
    assert len(RUNBOOK_URLS) == len(ALERT_NAMES)
    for url in RUNBOOK_URLS:
        page, _, anchor = url.partition("#")
        assert page.endswith("runbook.md"), url
        assert anchor in ANCHORS, url


def test_every_fault_kind_has_its_section() -> None:
    """Alerts from the supervisor link runbook.md#<fault>: each fault kind has that anchor and a heading."""
    sections = _sections()
    for kind in FaultKind:
        assert kind.value in ANCHORS, kind.value
        body = sections[kind.value]
        assert f"## {kind.value}\n" in body
        for heading in (
            "### Meaning",
            "### Impact",
            "### Confirm",
            "### What the supervisor did",
            "### By hand",
        ):
            assert heading in body, (kind.value, heading)


def test_alert_sections_have_the_runbook_form() -> None:
    """Each alert section says meaning, impact, diagnosis, mitigation and escalation."""
    sections = _sections()
    for name in ALERT_NAMES:
        body = sections[name]
        assert "### Meaning" in body and "### Impact" in body and "### Escalation" in body, name
        assert "### Diagnosis" in body and "Mitigation" in body, name


def test_every_state_is_in_the_state_table() -> None:
    """The state table has one row per server state, with an anchor `state-<name>`."""
    assert "| state | meaning | what the supervisor does in it |" in _sections()["states"]
    for state in ServerState:
        assert f"state-{state.value}" in ANCHORS, state.value
        assert f'<a id="state-{state.value}"></a>`{state.value}` |' in RUNBOOK, state.value


def test_links_inside_the_runbook_resolve() -> None:
    """Every `(#anchor)` link points at an anchor of the runbook."""
    links = set(re.findall(r"\]\(#([^)]+)\)", RUNBOOK))
    assert links, "the runbook links its sections"
    assert links <= ANCHORS, sorted(links - ANCHORS)


def test_every_subcommand_mentioned_exists() -> None:
    """Every `sglang-supervisor X` the runbook names is a subcommand of supervisor.cli's parser."""
    mentioned = _mentioned_subcommands()
    assert {"status", "restart", "pause", "resume", "drill"} <= mentioned
    unknown = mentioned - set(_subcommands())
    assert not unknown, f"runbook names subcommands the CLI does not have: {sorted(unknown)}"


def test_every_command_line_parses() -> None:
    """Each `sglang-supervisor ...` line of the code blocks is accepted by the CLI's argument parser."""
    lines = _code_lines()
    assert len(lines) >= 10
    parser = _parser()
    for line in lines:
        argv = shlex.split(line)[1:]
        try:
            parser.parse_args(argv)
        except SystemExit as exc:
            raise AssertionError(f"the CLI rejects: {line}") from exc


def test_every_metric_mentioned_exists() -> None:
    """Every sglang_supervisor_* name in the runbook is a metric (or series) the supervisor exports."""
    metrics = SupervisorMetrics()
    metrics.watch_servers(lambda: [ServerGauges("s", "serving", 0, {}, False)])
    text = metrics.render().decode()
    names = set()
    for name, kind in re.findall(r"^# TYPE (\S+) (\S+)", text, re.MULTILINE):
        names.add(name)
        if kind == "histogram":
            names |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
    mentioned = set(re.findall(r"\bsglang_supervisor_[a-z_]+[a-z]", RUNBOOK))
    assert "sglang_supervisor_server_state" in mentioned
    assert mentioned <= names, sorted(mentioned - names)
