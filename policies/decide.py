"""What the server loop does next about a fault — decided once, here, from the plan and where the server is. Pure.

`policies.triage.plan` chooses what cures a fault (relaunch on which rung, alert only, fail); `next_step` turns that
into the one step the loop executes without deciding again:

- `hold`: the server is paused (maintenance): the fault is journaled and nothing is done; at resume the probes
  judge anew, so only what is still true then is acted on (a wedge that ended during the pause is not);
- `degrade`: alert only: the tree keeps serving (`degraded`), nothing is killed and nothing else is launched;
- `abort`: abort the server's requests (`policies.abort`): the tree keeps serving, nothing is killed;
- `recover`: incident, forensics, kill, reap, release, verify free — then relaunch after the backoff, or `failed`
  when the plan says fail.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from policies.plan import Plan


class FaultStep(StrEnum):
    """The loop's next step about a fault."""

    HOLD = "hold"
    DEGRADE = "degrade"
    ABORT = "abort"
    RECOVER = "recover"


@dataclass(frozen=True)
class Next:
    """The step and the plan it carries out."""

    step: FaultStep
    plan: Plan


def next_step(paused: bool, plan: Plan) -> Next:
    """The one step the loop takes about a fault whose recovery `plan` chose."""
    if paused:
        return Next(FaultStep.HOLD, plan)
    if plan.action == "alert":
        return Next(FaultStep.DEGRADE, plan)
    if plan.action == "abort":
        return Next(FaultStep.ABORT, plan)
    return Next(FaultStep.RECOVER, plan)
