"""What a user copies (`files monitoring`) is what Prometheus runs: the scrape example passes promtool, its jobs
scrape the daemon and its servers, and the rules loaded are the packaged ones with only their `for:` shortened."""

from __future__ import annotations

import subprocess

import yaml

from tests.support.monitored import World, runbook_yaml
from tests.support.monitoring import EXPECTED_ALERTS
from tests.support.prometheus import SGLANG_JOB, SUPERVISOR_JOB, rules_differ_only_in_for
from tests.support.tools import ensure_promtool
from tests.support.wait import wait_for

SERVERS_UP_S = 120.0  # the slowest server loads for 25 s, on a machine busy with other tiers


def test_the_packaged_scrape_example_passes_promtool_check_config(world: World) -> None:
    """`files monitoring` carries prometheus.yml beside the rules, and `promtool check config` accepts both."""
    config = world.bundle / "prometheus.yml"
    result = subprocess.run(
        [str(ensure_promtool()), "check", "config", str(config)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 1 rule files found" in result.stdout
    assert f"SUCCESS: {len(EXPECTED_ALERTS)} rules found" in result.stdout


def test_the_runbook_shows_the_packaged_scrape_jobs(world: World) -> None:
    """The runbook's scrape config is the packaged example's, job for job."""
    packaged = yaml.safe_load((world.bundle / "prometheus.yml").read_text())["scrape_configs"]
    shown = next(block for block in runbook_yaml(world.runbook) if "scrape_configs" in block)
    assert shown["scrape_configs"] == packaged


def test_prometheus_loads_the_packaged_rules_with_only_their_for_shortened(world: World) -> None:
    """Every packaged alert is loaded and healthy; the loaded file differs from the packaged one only in `for:`."""
    packaged = (world.bundle / "alerts.yaml").read_text()
    assert rules_differ_only_in_for(packaged, world.rules.read_text())
    rules = [rule for group in world.prometheus.rule_groups() for rule in group["rules"]]
    assert {rule["name"] for rule in rules} == EXPECTED_ALERTS
    assert all(rule["health"] == "ok" for rule in rules), [r for r in rules if r["health"] != "ok"]


def test_the_packaged_jobs_scrape_the_daemon_and_every_simulated_server(world: World) -> None:
    """Under the example's job names the daemon's /metrics is up, and each server's SGLang /metrics was scraped."""
    up = world.prometheus.query(f'up{{job="{SUPERVISOR_JOB}"}}')
    assert [(s["metric"]["instance"], s["value"][1]) for s in up] == [(world.instance, "1")]
    servers = {f"127.0.0.1:{spec.port}" for spec in world.host.specs}

    def scraped() -> bool:
        found = world.prometheus.samples(f'up{{job="{SGLANG_JOB}"}} == 1', world.started)
        return {s["metric"]["instance"] for s in found} == servers

    wait_for(scraped, SERVERS_UP_S, "every server's /metrics scraped up")
    info = world.prometheus.query("sglang_supervisor_build_info")
    assert [s["metric"]["version"] for s in info] == [world.installed.version]
