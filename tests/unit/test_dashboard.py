"""monitoring/grafana-dashboard.json: stable ids, the datasource variable everywhere, only metrics we render."""

from __future__ import annotations

import re

from supervisor.reporting.metrics import STATES
from tests.support.monitoring import dashboard, populated, targets

REQUIRED_TITLES = {
    "Server state",
    "Incidents by fault",
    "Fallback rung",
    "Probe latency p50 / p99",
    "Canary pass rate",
    "Time to serving (mean, 1h)",
    "Alert deliveries",
}


def test_structure_ids_and_grid() -> None:
    """Stable uid, unique panel ids, grid within 24 columns, the panels on-call needs."""
    data = dashboard()
    assert data["id"] is None and 8 <= len(data["uid"]) <= 40
    panels = data["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    for p in panels:
        grid = p["gridPos"]
        assert grid["w"] >= 1 and grid["x"] + grid["w"] <= 24, p["title"]
        assert p["description"] and p["fieldConfig"]["defaults"]["unit"], p["title"]
        assert p["targets"], p["title"]
    assert {p["title"] for p in panels} >= REQUIRED_TITLES
    assert any(p["type"] == "state-timeline" for p in panels)


def test_state_timeline_codes_match_the_state_names() -> None:
    """The state timeline encodes state i as i and maps i back to the same state's name."""
    (panel,) = [p for p in dashboard()["panels"] if p["type"] == "state-timeline"]
    codes = dict(
        re.findall(r'(\d+) \* max by \(instance, server\) \([^)]*state="(\w+)"', panel["targets"][0]["expr"])
    )
    assert {int(code): state for code, state in codes.items()} == dict(enumerate(STATES[1:], start=1))
    mapping = panel["fieldConfig"]["defaults"]["mappings"][0]["options"]
    assert {int(code): m["text"] for code, m in mapping.items()} == dict(enumerate(STATES))


def test_every_panel_and_variable_uses_the_datasource_variable() -> None:
    """Panels, targets and query variables all point at ${datasource}, which is a datasource variable."""
    data = dashboard()
    variables = {v["name"]: v for v in data["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for v in variables.values():
        if v["type"] == "query":
            assert v["datasource"]["uid"] == "${datasource}", v["name"]
    for p in data["panels"]:
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        for t in p["targets"]:
            assert t["datasource"]["uid"] == "${datasource}", p["title"]


def test_every_metric_named_exists_in_the_render() -> None:
    """Each sglang_supervisor_* name in a query or variable is a series SupervisorMetrics exposes."""
    exposed = {
        line.split("{")[0].split(" ")[0]
        for line in populated().render().decode().splitlines()
        if line and not line.startswith("#")
    }
    queries = [expr for _, _, expr in targets()]
    queries += [v["definition"] for v in dashboard()["templating"]["list"] if v["type"] == "query"]
    named = {name for q in queries for name in re.findall(r"sglang_supervisor_\w+", q)}
    assert named, "the dashboard names no metric"
    assert named <= exposed, named - exposed
