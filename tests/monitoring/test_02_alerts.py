"""Every alert of the packaged rules fires from a real cause on the simulated host, with the labels the rules keep,
and resolves after the recovery (tests/support/alert_causes.py has the causes and recoveries). An alert on a state
resolves within the run; one over a window of events resolves once its window has passed with no new event, which
the run's own series, replayed through the packaged rules by promtool, show (tests/support/recorded.py)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.support.alert_causes import Cause
from tests.support.monitored import World
from tests.support.recorded import replay
from tests.support.wait import wait_for

# Each cause's chain (fault, firing, recovery) takes under a minute and a half on an idle machine; all run at once
# from the start of the tier.
CHAIN_S = 200.0
RESOLVED_AFTER_S = 3.0  # seconds without a firing sample before an alert counts as resolved
IN_FLIGHT_S = (
    5.0  # an event under way at the recovery (a delivery's last retry, a write) may still be counted
)
STATE_ALERTS = ("SglangServerFailed", "SglangServerDegraded", "SglangCanaryUnproven", "SglangServerDown")
WINDOW_ALERTS = (
    "SglangWedgeDetected",
    "SglangServerCrashLoop",
    "SglangParserMisconfigured",
    "SglangGpuFault",
    "SglangSupervisorStateUnwritable",
    "SglangSupervisorAlertDeliveryFailing",
)
# What a cause brings about besides its own alert: the GPU server fails after its fatal Xid (not retryable); the
# full state_dir fails the state file's writes as well as the journal's; the crash-looping server, never serving
# for a whole scrape between its launches, may stay down past SglangServerDown's shortened for: (20 s) on a busy
# machine, as a crash loop outlasting the real 10 minutes pages in production.
CONSEQUENCES = (
    {"alertname": "SglangServerFailed", "server": "gpu"},
    {"alertname": "SglangSupervisorStateUnwritable", "file": "state"},
    {"alertname": "SglangServerDown", "server": "crashy"},
)
COUNTERS = (
    "sglang_supervisor_incidents_total",
    "sglang_supervisor_restarts_total",
    "sglang_supervisor_state_write_failures_total",
    "sglang_supervisor_alert_deliveries_total",
)


def spans(world: World, cause: Cause) -> list[tuple[float, float]]:
    """The firing spans of the cause's alert so far (a failed cause fails the test with its traceback)."""
    if cause.error:
        raise AssertionError(f"the cause of {cause.alert} failed:\n{cause.error}")
    return world.prometheus.firing_spans(cause.alert, cause.labels, world.started)


def recovered(cause: Cause) -> float | None:
    if cause.error:
        raise AssertionError(f"the cause of {cause.alert} failed:\n{cause.error}")
    return cause.recovered


@pytest.mark.parametrize("alert", STATE_ALERTS + WINDOW_ALERTS)
def test_the_alert_fires_from_its_cause(world: World, alert: str) -> None:
    """The alert fires after its fault, with the server, file or sink it is about."""
    cause = world.causes.causes[alert]
    found = wait_for(lambda: spans(world, cause), CHAIN_S, f"{alert} {cause.labels} to fire")
    assert cause.started is not None and found[0][0] >= cause.started - 1, (cause, found)


@pytest.mark.parametrize("alert", STATE_ALERTS)
def test_the_alert_on_a_state_resolves_after_the_recovery(world: World, alert: str) -> None:
    """The alert fired until the recovery, then resolved: no longer firing in Prometheus."""
    cause = world.causes.causes[alert]

    def resolved() -> list[tuple[float, float]] | None:
        found = spans(world, cause)
        done = cause.recovered is not None and found and found[-1][1] < time.time() - RESOLVED_AFTER_S
        return found if done else None

    found = wait_for(resolved, CHAIN_S, f"{alert} {cause.labels} to resolve after its recovery")
    assert cause.recovered is not None and found[-1][1] >= cause.recovered - RESOLVED_AFTER_S, (cause, found)
    firing = [a for a in world.prometheus.alerts() if a["labels"]["alertname"] == alert]
    assert not [a for a in firing if all(a["labels"].get(k) == v for k, v in cause.labels.items())], firing


@pytest.mark.parametrize("alert", WINDOW_ALERTS)
def test_the_alert_over_a_window_of_events_resolves_once_the_window_has_passed(
    world: World, alert: str, tmp_path: Path
) -> None:
    """After the recovery the cause's counter stays flat, and the run's series replayed through the packaged rule
    (its real window, its real young-daemon age) show the alert gone once that window has passed."""
    cause = world.causes.causes[alert]
    at = wait_for(lambda: recovered(cause), CHAIN_S, f"the recovery of {alert}") + IN_FLIGHT_S

    def scraped_since() -> bool:
        return bool(world.prometheus.query(f"max(timestamp({cause.events})) >= {at:.3f}"))

    wait_for(scraped_since, CHAIN_S, f"a scrape of {cause.events} after the recovery")
    events = f"sum({cause.events})"
    before, now = world.prometheus.query(events, at=at), world.prometheus.query(events)
    assert [s["value"][1] for s in before] == [s["value"][1] for s in now], (cause.events, before, now)
    replay(world.prometheus, world.bundle, alert, cause.labels, world.started, time.time(), tmp_path)


def test_no_alert_fires_without_its_cause(world: World) -> None:
    """Once every chain has ended, each alert that fired was a cause's own (or what a cause brings about): no
    server starting, crash-looping or recovering on a busy machine pages by mistake."""
    world.causes.join(CHAIN_S)
    expected = [
        *({"alertname": c.alert, **c.labels} for c in world.causes.causes.values()),
        *CONSEQUENCES,
    ]
    fired = world.prometheus.samples('ALERTS{alertstate="firing"}', world.started)
    unexplained = [
        s["metric"]
        for s in fired
        if not any(all(s["metric"].get(k) == v for k, v in want.items()) for want in expected)
    ]
    assert not unexplained, "alerts without a cause:\n" + "\n".join(map(str, unexplained))


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
