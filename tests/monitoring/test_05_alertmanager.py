"""Prometheus → the real Alertmanager routed as the runbook's example → the receivers: every critical alert of
the run pages (and its resolve follows), every warning goes to the ticket queue, each with the routing labels and a
runbook_url naming a section of the installed runbook."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import yaml

from tests.support.alert_causes import PAGER, TICKET
from tests.support.monitored import World, routing_example
from tests.support.tools import ensure_amtool
from tests.support.wait import wait_for

DELIVERY_S = 60.0  # group_wait and group_interval of 1 s, plus Prometheus' resend to Alertmanager


def notified(world: World, path: str) -> list[tuple[str, dict[str, Any]]]:
    """(status, alert) of every alert in every notification delivered to `path`."""
    return [(a["status"], a) for d in world.receiver.at(path) for a in d.body["alerts"]]


def rule_severities(world: World) -> dict[str, str]:
    rules = yaml.safe_load((world.bundle / "alerts.yaml").read_text())["groups"][0]["rules"]
    return {rule["alert"]: rule["labels"]["severity"] for rule in rules}


def fired(world: World) -> set[str]:
    """The alerts that fired at any moment of the run, by name."""
    found = world.prometheus.samples('ALERTS{alertstate="firing"}', world.started)
    return {series["metric"]["alertname"] for series in found}


def test_the_runbook_routing_example_passes_amtool(world: World, tmp_path: Path) -> None:
    """The routing example in the installed runbook is a valid Alertmanager config as printed."""
    config = tmp_path / "alertmanager.yml"
    config.write_text(yaml.safe_dump(routing_example(world.runbook)))
    check = subprocess.run(
        [str(ensure_amtool()), "check-config", str(config)], capture_output=True, text=True, timeout=60
    )
    assert check.returncode == 0, check.stdout + check.stderr


def test_every_critical_alert_pages_and_every_warning_goes_to_tickets(world: World) -> None:
    """Each alert that fired reached the receiver its severity routes to, and its resolve followed once it resolved
    in Prometheus (an alert over a window of events stays firing for the rest of the run)."""
    severity = rule_severities(world)
    expected = {"critical": PAGER, "warning": TICKET}

    def missing() -> list[str]:
        now_firing = {a["labels"]["alertname"] for a in world.prometheus.alerts() if a["state"] == "firing"}
        return [
            f"{name} ({status}) at {expected[severity[name]]}"
            for name in fired(world)
            for status in ("firing", "resolved")
            if not (status == "resolved" and name in now_firing)
            and not any(
                a["labels"]["alertname"] == name and s == status
                for s, a in notified(world, expected[severity[name]])
            )
        ]

    last: list[str] = []

    def all_delivered() -> bool:
        last[:] = missing()
        return not last

    try:
        wait_for(all_delivered, DELIVERY_S, "every fired alert delivered, and its resolve once resolved")
    except AssertionError as exc:
        got = {
            path: sorted({(a["labels"]["alertname"], s) for s, a in notified(world, path)})
            for path in (PAGER, TICKET)
        }
        raise AssertionError(f"{exc}: missing {last}; delivered {got}") from None
    assert {"critical"} == {a["labels"]["severity"] for _, a in notified(world, PAGER)}
    assert {"warning"} == {a["labels"]["severity"] for _, a in notified(world, TICKET)}
    # elsewhere: the group alerts from a real etcd partition (tests/etcd); the gateway alert's series from a
    # gateway that is down (tests/gateway) and its rule by promtool — this host has no gateway to lose
    elsewhere = {"SglangGroupStuckInBarrier", "SglangGroupEtcdUnreachable", "SglangGatewayMembershipStale"}
    assert fired(world) >= set(severity) - elsewhere


def test_pages_carry_the_routing_labels_and_a_runbook_url_to_an_existing_section(world: World) -> None:
    """A page names alertname, severity, the host (instance) and the server the example groups by; its
    runbook_url is runbook.md#<an anchor of the installed runbook>."""
    anchors = set(re.findall(r'<a id="([^"]+)"></a>', world.runbook.read_text()))
    group_by = routing_example(world.runbook)["route"]["group_by"]
    pages = [a for _, a in notified(world, PAGER)]
    assert pages
    for alert in [*pages, *(a for _, a in notified(world, TICKET))]:
        labels = alert["labels"]
        name = labels["alertname"]
        page, anchor = alert["annotations"]["runbook_url"].split("#")
        assert page == world.runbook.name and anchor == name and anchor in anchors, (
            name,
            alert["annotations"],
        )
        if name != "SglangSupervisorAbsent":  # absent() has no labels to keep
            assert labels["instance"] == world.instance, labels
    servers = set(world.host.server_names())
    by_server = [a["labels"] for a in pages if "server" in a["labels"]]
    assert by_server and all(labels["server"] in servers for labels in by_server)
    assert set(group_by) >= {"alertname", "instance", "server"}
