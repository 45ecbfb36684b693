"""The daemon stopped (`systemctl stop`): Prometheus pages that nothing watches the host, and the pages resolve
when it is started again."""

from __future__ import annotations

from tests.support.monitored import World
from tests.support.wait import wait_for

FIRE_S = 90.0  # the shortened for: (10 s, 20 s) plus scrapes and evaluations on a busy machine
RESOLVE_S = 90.0  # a restarted daemon serves /metrics within seconds; the servers need not serve


ALERTS = ("SglangSupervisorDown", "SglangSupervisorAbsent")


def firing(world: World, alert: str) -> bool:
    return any(
        a["labels"]["alertname"] == alert and a["state"] == "firing" for a in world.prometheus.alerts()
    )


def test_a_stopped_daemon_fires_down_and_absent_which_resolve_when_it_is_back(world: World) -> None:
    """SIGTERM to the daemon: SglangSupervisorDown (for its instance) and SglangSupervisorAbsent fire; a new
    daemon on the same config resolves both."""
    world.causes.join(FIRE_S)
    assert not world.causes.stop_daemon()
    for alert in ALERTS:
        wait_for(lambda alert=alert: firing(world, alert), FIRE_S, f"{alert} firing")
    world.causes.start_daemon()
    for alert in ALERTS:
        wait_for(lambda alert=alert: not firing(world, alert), RESOLVE_S, f"{alert} resolved")
    for alert in ALERTS:
        cause = world.causes.causes[alert]
        (span,) = world.prometheus.firing_spans(alert, cause.labels, world.started)
        assert cause.started is not None and cause.started < span[0], (alert, cause, span)
