"""Every alert of the packaged rules fires from a real cause on the simulated host, with the labels the rules
keep, and resolves after the recovery (tests/support/alert_causes.py has the causes and recoveries)."""

from __future__ import annotations

import time

import pytest

from tests.support.alert_causes import Cause
from tests.support.monitored import World
from tests.support.wait import wait_for

# Each cause's chain (fault, firing, recovery, the window passing) takes under a minute and a half on an idle
# machine; all run at once from the start of the tier.
CHAIN_S = 200.0
RESOLVED_AFTER_S = 3.0  # seconds without a firing sample before an alert counts as resolved
COUNTERS = (
    "sglang_supervisor_incidents_total",
    "sglang_supervisor_restarts_total",
    "sglang_supervisor_state_write_failures_total",
    "sglang_supervisor_alert_deliveries_total",
)
ALERTS = (
    "SglangWedgeDetected",
    "SglangServerCrashLoop",
    "SglangServerFailed",
    "SglangParserMisconfigured",
    "SglangServerDegraded",
    "SglangCanaryUnproven",
    "SglangGpuFault",
    "SglangServerDown",
    "SglangSupervisorStateUnwritable",
    "SglangSupervisorAlertDeliveryFailing",
)


def fired_then_resolved(world: World, cause: Cause) -> list[tuple[float, float]] | None:
    """The firing spans of the cause's alert once one has ended; None while none has."""
    if cause.error:
        raise AssertionError(f"the cause of {cause.alert} failed:\n{cause.error}")
    spans = world.prometheus.firing_spans(cause.alert, cause.labels, world.started)
    if spans and spans[-1][1] < time.time() - RESOLVED_AFTER_S:
        return spans
    return None


@pytest.mark.parametrize("alert", ALERTS)
def test_the_alert_fires_from_its_cause_and_resolves_after_the_recovery(world: World, alert: str) -> None:
    """The alert fires after its fault (with the server, file or sink it is about), then resolves."""
    cause = world.causes.causes[alert]
    spans = wait_for(
        lambda: fired_then_resolved(world, cause), CHAIN_S, f"{alert} {cause.labels} to fire, then resolve"
    )
    assert cause.started is not None and spans[0][0] >= cause.started - 1, (cause, spans)
    firing = [a for a in world.prometheus.alerts() if a["labels"]["alertname"] == alert]
    assert not [a for a in firing if all(a["labels"].get(k) == v for k, v in cause.labels.items())], firing


def test_every_counter_an_alert_counts_was_scraped_at_0_before_its_first_increment(world: World) -> None:
    """A counter series that counted an event first showed 0 (else increase() misses the event), unless the
    event came before Prometheus' first scrape of the daemon (the rules' young-daemon clause covers those)."""
    world.causes.join(CHAIN_S)
    first_scrape = min(
        float(t)
        for s in world.prometheus.samples('up{job="sglang-supervisor"}', world.started)
        for t, _ in s["values"]
    )
    late: list[str] = []
    for name in COUNTERS:
        for series in world.prometheus.samples(name, world.started):
            t, value = series["values"][0]
            counted = any(float(v) > 0 for _, v in series["values"])
            if counted and float(value) > 0 and float(t) > first_scrape + 1:
                late.append(f"{series['metric']} first seen at {value}")
    assert not late, "series born at their first increment:\n" + "\n".join(late)
