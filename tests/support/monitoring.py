"""The monitoring bundle (alert rules, Grafana dashboard) and a metrics registry with every series populated."""

from __future__ import annotations

import json
import re
import subprocess
from typing import Any

from supervisor.reporting.metrics import ServerGauges, SupervisorMetrics
from tests.support.paths import REPO
from tests.support.tools import ensure_promtool

MONITORING = REPO / "monitoring"
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
    "SglangGatewayMembershipStale",
    "SglangGpuFault",
    "SglangCanaryUnproven",
    "SglangSupervisorStateUnwritable",
    "SglangSupervisorAlertDeliveryFailing",
    "SglangGroupStuckInBarrier",
    "SglangGroupEtcdUnreachable",
}
DASHBOARD = MONITORING / "grafana-dashboard.json"
SUBSTITUTIONS = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "1h"}


def promtool(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    """Run the real promtool with a timeout, capturing its output."""
    return subprocess.run(
        [str(ensure_promtool()), *args], input=stdin, capture_output=True, timeout=120, check=False
    )


def dashboard() -> dict[str, Any]:
    """The dashboard JSON."""
    data: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return data


def targets() -> list[tuple[int, str, str]]:
    """(panel id, refId, expr) of every panel target."""
    return [(p["id"], t["refId"], t["expr"]) for p in dashboard()["panels"] for t in p["targets"]]


def concrete(expr: str) -> str:
    """The expression with Grafana's variables replaced by values promtool accepts."""
    for variable, value in SUBSTITUTIONS.items():
        expr = expr.replace(variable, value)
    return re.sub(r"\$\{?\w+\}?", ".*", expr)


def populated() -> SupervisorMetrics:
    """A registry with every method called at least once (the dashboard names only metrics it renders)."""
    m = SupervisorMetrics(version="0.1.0")
    m.watch_servers(
        lambda: [ServerGauges(s, "serving", 1, {"decode_wedge": 1}, False) for s in ("prefill", "decode")]
    )
    for server in ("prefill", "decode"):
        m.incident(server, "decode_wedge")
        m.observe_time_to_serving(server, 42.0)
        m.probe(server, "health", "ok", 0.02)
        m.probe(server, "health", "timeout", 20.0)
        m.canary(server, "tool_call", "pass")
        m.canary(server, "reasoning", "fail")
        m.observe_gpu_release(server, 3.5)
    m.observe_detection("decode_wedge", 12.0)
    m.alert_delivery("pagerduty", "ok")
    m.alert_delivery("slack", "dropped")
    m.set_group("dsv3", 2, True, 0.0, 300.0)
    m.set_group_member("dsv3", 1, "running")
    m.group_bump("dsv3")
    m.tick(1_780_000_000.0)
    return m
