"""The supervisor's metrics: contract names, types and labels as docs/contracts.md promises."""

from __future__ import annotations

import re

import pytest

from supervisor.reporting.metrics import CONTENT_TYPE, FAULT_KINDS, STATES, ServerGauges, SupervisorMetrics
from tests.support.monitoring import populated
from tests.support.paths import REPO

CONTRACT_METRICS = {
    "sglang_supervisor_server_state": "gauge",
    "sglang_supervisor_restarts_total": "counter",
    "sglang_supervisor_incidents_total": "counter",
    "sglang_supervisor_detection_latency_seconds": "histogram",
    "sglang_supervisor_time_to_serving_seconds": "histogram",
    "sglang_supervisor_probe_duration_seconds": "histogram",
    "sglang_supervisor_probe_results_total": "counter",
    "sglang_supervisor_canary_results_total": "counter",
    "sglang_supervisor_fallback_rung": "gauge",
    "sglang_supervisor_gpu_release_duration_seconds": "histogram",
    "sglang_supervisor_alert_deliveries_total": "counter",
    "sglang_supervisor_loop_last_tick_timestamp_seconds": "gauge",
    "sglang_supervisor_build_info": "gauge",
    "sglang_supervisor_group_generation": "gauge",
    "sglang_supervisor_group_etcd_up": "gauge",
    "sglang_supervisor_group_barrier_wait_seconds": "gauge",
    "sglang_supervisor_group_barrier_timeout_seconds": "gauge",
    "sglang_supervisor_group_member_phase": "gauge",
    "sglang_supervisor_group_generation_bumps_total": "counter",
}


def test_every_contract_metric_is_exposed_with_its_type() -> None:
    """Each metric of docs/contracts.md appears in the render with the contract's type."""
    text = populated().render().decode()
    for name, kind in CONTRACT_METRICS.items():
        assert f"# TYPE {name} {kind}\n" in text, name


def test_vocabulary_matches_docs_contracts() -> None:
    """The states and fault kinds used as label values are exactly those of docs/contracts.md."""
    contracts = (REPO / "docs" / "contracts.md").read_text()

    def listed(heading: str) -> list[str]:
        section = contracts.split(heading, 1)[1].split("##", 1)[0]
        return re.findall(r"[a-z_]+", " ".join(re.findall(r"`([^`]+)`", section)))

    assert list(STATES) == listed("## Server states")
    assert list(FAULT_KINDS) == listed("## Fault kinds")


def test_server_state_is_read_from_the_owner_at_scrape_time() -> None:
    """server_state is a state set read when scraped: 1 for the current state, 0 for every other state."""
    m = SupervisorMetrics()
    views = [ServerGauges("unified", "starting", 0, {}, False)]
    m.watch_servers(lambda: list(views))
    views[0] = ServerGauges("unified", "recovering", 2, {"crash": 1}, True)
    values = {
        s: m.registry.get_sample_value("sglang_supervisor_server_state", {"server": "unified", "state": s})
        for s in STATES
    }
    assert values == {s: (1.0 if s == "recovering" else 0.0) for s in STATES}
    assert m.registry.get_sample_value("sglang_supervisor_fallback_rung", {"server": "unified"}) == 2.0
    assert m.registry.get_sample_value("sglang_supervisor_canary_unproven", {"server": "unified"}) == 1.0
    crash = {"server": "unified", "fault": "crash"}
    assert m.registry.get_sample_value("sglang_supervisor_restarts_total", crash) == 1.0


def test_new_server_starts_every_fault_counter_at_zero() -> None:
    """A server's first appearance creates restart and incident series at 0 for every fault kind."""
    m = SupervisorMetrics()
    m.watch_servers(lambda: [ServerGauges("decode", "starting", 0, {}, False)])
    m.incident("decode", "oom")
    for fault in FAULT_KINDS:
        labels = {"server": "decode", "fault": fault}
        assert m.registry.get_sample_value("sglang_supervisor_restarts_total", labels) == 0.0
        expected = 1.0 if fault == "oom" else 0.0
        assert m.registry.get_sample_value("sglang_supervisor_incidents_total", labels) == expected


def test_duration_histograms_exist_at_zero_before_their_first_observation() -> None:
    """The detection histogram of every fault kind and a new server's time-to-serving, startup and GPU-release
    histograms are exposed at 0, so the dashboard's increase() over an hour sees their first observation."""
    m = SupervisorMetrics()
    m.watch_servers(lambda: [ServerGauges("decode", "starting", 0, {}, False)])
    for fault in FAULT_KINDS:
        count = m.registry.get_sample_value(
            "sglang_supervisor_detection_latency_seconds_count", {"fault": fault}
        )
        assert count == 0.0, fault
    for name in ("time_to_serving_seconds", "startup_duration_seconds", "gpu_release_duration_seconds"):
        count = m.registry.get_sample_value(f"sglang_supervisor_{name}_count", {"server": "decode"})
        assert count == 0.0, name


def test_declared_sink_has_every_outcome_at_zero() -> None:
    """declare_sink creates ok/failed/dropped delivery counters at 0."""
    m = SupervisorMetrics()
    m.declare_sink("webhook")
    for outcome in ("ok", "failed", "dropped"):
        labels = {"sink": "webhook", "outcome": outcome}
        assert m.registry.get_sample_value("sglang_supervisor_alert_deliveries_total", labels) == 0.0


@pytest.mark.parametrize(
    "call",
    [
        lambda m: m.watch_servers(lambda: [ServerGauges("s", "running", 0, {}, False)]) or m.render(),
        lambda m: m.incident("s", "segfault"),
        lambda m: m.probe("s", "health", "slow", 1.0),
        lambda m: m.canary("s", "tool_call", "maybe"),
        lambda m: m.alert_delivery("slack", "retried"),
    ],
)
def test_unknown_label_value_is_rejected(call: object) -> None:
    """Values outside the shared vocabulary raise instead of creating a stray series."""
    m = SupervisorMetrics()
    with pytest.raises(ValueError, match="allowed"):
        call(m)  # type: ignore[operator]


def test_content_type_is_text_format_004() -> None:
    """The exposition content type is the Prometheus text format every Prometheus version accepts."""
    assert CONTENT_TYPE.startswith("text/plain; version=0.0.4")
