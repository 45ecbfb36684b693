"""How long a stop of the daemon takes at most: what a stop timeout must give it (`docker stop -t`, a pod's
`terminationGracePeriodSeconds`, the unit's `TimeoutStopSec=`).

SIGTERM stops every server at once: behind a `[gateway]` each first leaves it and waits for its own requests
(up to three gateway timeouts and `drain_s`); then each is drained (SIGTERM to its main process, up to `drain_grace_s`, then
SIGKILL of the group) and reaped, its processes, GPUs and ports verified gone, with up to `release_deadline_s` for
the reap; the alert sinks get `ALERT_FLUSH_S` to deliver what is queued. A stop timeout shorter than that kills
the daemon mid-drain: in a container the kernel then kills everything of its PID namespace at once (no drain, the
in-flight requests fail); under systemd, `KillMode=process` leaves the servers to the next start, which adopts or
reaps them.

Not in the budget: the checks after the reap that the GPUs and then the ports are free (up to
`release_deadline_s` each, on a GPU or port still held). By then no process of ours is left to drain, so a kill
only cuts the check short (the next start checks again). A stop that finds a recovery under way waits for its
forensics (`FORENSICS_S`) instead of a drain, then its kill-mode reap: the longer of the two counts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from supervisor.config.models import Config
from supervisor.host.forensics import BUDGET_S as FORENSICS_S

ALERT_FLUSH_S = 5
SLACK_S = 5  # the daemon's own exit: state written, sockets closed
RECOMMENDED_S = 180  # the shipped unit's TimeoutStopSec=, the Dockerfile's and the pod's stop timeout


@dataclass(frozen=True)
class StopBudget:
    """The seconds a stop needs, and the sum it comes from."""

    seconds: int
    why: str


def stop_budget(config: Config) -> StopBudget:
    """The longest a SIGTERM of the daemon takes with this config, over its servers (they stop together)."""
    release = math.ceil(config.supervisor.release_deadline_s)
    slowest = max(config.servers, key=lambda s: s.drain_grace_s)
    grace = math.ceil(slowest.drain_grace_s)
    forensics = math.ceil(FORENSICS_S)
    first = f"drain_grace_s {grace} ({slowest.name})" if grace >= forensics else f"forensics {forensics}"
    total = max(grace, forensics) + release + ALERT_FLUSH_S + SLACK_S
    why = f"{first} + release_deadline_s {release} + alert flush {ALERT_FLUSH_S} + exit {SLACK_S}"
    gw = config.gateway
    if gw is not None:  # out of the gateway first (its calls), then the server's own requests done
        gateway = math.ceil(gw.timeout_s * 3 + gw.drain_s)
        total += gateway
        why = f"gateway leave and drain_s {gateway} + {why}"
    return StopBudget(total, why)


def advice(budget: StopBudget) -> tuple[str, bool]:
    """One line for `check-config`: the budget and the stop timeouts that give it; True when the shipped
    timeouts are too short for it (a warning)."""
    short = budget.seconds > RECOMMENDED_S
    line = (
        f"stop budget: {budget.seconds} s ({budget.why}): give docker stop -t / --stop-timeout, "
        f"terminationGracePeriodSeconds and TimeoutStopSec= at least {budget.seconds} s"
    )
    if short:
        line += f"; the shipped unit, Dockerfile and manifest give {RECOMMENDED_S} s: raise them"
    else:
        line += f" (the shipped unit, Dockerfile and manifest give {RECOMMENDED_S} s)"
    return line, short
