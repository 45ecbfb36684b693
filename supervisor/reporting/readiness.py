"""Readiness for load balancers and readiness probes: is a server `serving` and proven, in one line.

SGLang's own `/health` answers 200 while a server leaks markup or is wedged mid-decode; this answers 200 only
while the server's owner holds `serving` with a passing canary (not `unproven`, not `degraded`, not recovering,
starting or paused), SGLang does not report its engine paused by its client (its own `/ready` is 503 then),
and the loop that owns it is beating. It is read from the state the owners hold — no probe
is sent per request, so a load balancer polling every second costs a lookup.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Readiness:
    """One server's verdict and the line that says why."""

    server: str
    ready: bool
    line: str


def verdict(
    server: str,
    state: str,
    reason: str,
    unproven: str,
    since: float,
    stale_s: float | None,
    engine_paused: str = "",
) -> Readiness:
    """`server` is ready only when `serving`, proven, its loop beats (`stale_s` None) and its engine is not
    paused by its client (`engine_paused`: why, as SGLang's own `/ready` says 503 then); else why not."""
    if stale_s is not None:
        why = f"the supervisor's loop has not beaten for {stale_s:.0f} s: its state cannot be trusted"
        return Readiness(server, False, f"{server} not ready: {why}")
    if state in ("serving", "degraded") and engine_paused:
        return Readiness(server, False, f"{server} not ready: {engine_paused}")
    if state == "serving" and not unproven:
        at = time.strftime("%H:%M:%S", time.localtime(since))
        return Readiness(server, True, f"{server} ready: serving and proven by its canary (since {at})")
    if state == "serving":
        return Readiness(server, False, f"{server} not ready: {unproven}")
    return Readiness(server, False, f"{server} not ready: {state}: {_one_line(reason)}")


def _one_line(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= 300 else line[:299] + "…"


def overall(verdicts: Iterable[Readiness]) -> tuple[bool, str]:
    """The host is ready when every server is; the lines of those that are not (or that all are)."""
    found = list(verdicts)
    not_ready = [v.line for v in found if not v.ready]
    if not not_ready:
        return True, f"ready: {len(found)} server(s) serving and proven"
    return False, "\n".join(not_ready)
