"""The journal: the daemon's structured lines reach journald whole (MESSAGE is the JSON object, PRIORITY its
level), the runbook's journal queries run as written, and SGLang's own output stays in its log file."""

from __future__ import annotations

import json
import re

from supervisor.reporting.logsetup import PRIORITIES
from tests.support.paths import REPO
from tests.systemd.machine import LOGS, UNIT, Machine

# Every `journalctl -u sglang-supervisor … | jq …` line of the runbook.
QUERY = re.compile(r"^(journalctl -u sglang-supervisor .*\| jq .*)$", re.MULTILINE)


def test_structured_lines_reach_the_journal_with_their_fields(machine: Machine) -> None:
    """`journalctl -o json`: each of the daemon's lines is a JSON MESSAGE with event, level, timestamp and its
    bound context, PRIORITY follows the level, and the unit and identifier are systemd's."""
    entries = [e for e in machine.journal("", "--since=-1h") if e.get("_SYSTEMD_UNIT") == f"{UNIT}.service"]
    lines = [(e, json.loads(e["MESSAGE"])) for e in entries if str(e.get("MESSAGE", "")).startswith("{")]
    assert len(lines) > 20, entries[:5]
    for entry, line in lines:
        assert {"event", "level", "timestamp"} <= line.keys(), line
        assert entry["SYSLOG_IDENTIFIER"] == UNIT and entry["_UID"] == machine.sh("id -u sglang").strip()
        assert int(entry["PRIORITY"]) == PRIORITIES[line["level"]], (entry["PRIORITY"], line)
    events = {line["event"] for _, line in lines}
    assert {
        "daemon.started",
        "state.transition",
        "fault.detected",
        "adopt.adopted",
        "config.reloaded",
    } <= events
    transition = next(line for _, line in lines if line["event"] == "state.transition")
    assert {"server", "old", "new", "reason"} <= transition.keys()
    assert {line["level"] for _, line in lines} >= {"info", "warning"}


def test_the_runbooks_journal_queries_run_as_written(machine: Machine) -> None:
    """Each `journalctl -u sglang-supervisor … | jq …` of the runbook exits 0 on this journal (systemd's own
    lines about the unit and a watchdog's traceback are in it too), and the first-five-minutes one finds
    the warnings."""
    queries = QUERY.findall((REPO / "runbook.md").read_text())
    assert len(queries) >= 5, queries
    for query in queries:
        result = machine.run(["sh", "-c", query])
        assert result.returncode == 0 and not result.stderr, f"{query}\n{result.stderr[-500:]}"
    first = machine.sh(queries[0])
    assert '"level":"warning"' in first, first[-500:]


def test_sglangs_output_stays_in_its_log_file(machine: Machine) -> None:
    """What SGLang prints (its startup lines, its batch lines) is in log_dir/<server>.log, never in the journal."""
    log = machine.sh(f"cat {LOGS}/sim.log")
    assert "The server is fired up and ready to roll!" in log and "Decode batch" in log
    journal = machine.sh("journalctl --no-pager -o cat --since=-1h")
    assert "fired up and ready to roll" not in journal and "Decode batch" not in journal
