"""Restart budget and exponential backoff (DESIGN §4, aesthetics lesson 8).

Defaults follow Kubernetes CrashLoopBackOff (exponential, 300 s cap, reset after 10 min clean) with a
systemd-style start limit (N restarts within a window ⇒ failed), plus a slow retry so that a failed
server is retried every `slow_retry_s` instead of being abandoned.

`history` is the restart times of the current *streak*: the daemon clears it once the server has
been serving for `stable_after_s` (`is_stable`). Within a streak, once the budget has been spent,
every further restart is a slow retry until the server is stable again.

With `immediate_first` the first restart of a streak goes at once, as Kubernetes restarts a container
that exits for the first time: a single crash of a stable server costs no waiting. The backoff starts
with the second restart of the streak (`initial_s`, then ×`factor`), so a crash loop still slows down.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


class RestartParams(Protocol):
    """The restart settings a decision needs (`supervisor.config.RestartConfig` satisfies it)."""

    @property
    def restarts(self) -> int: ...
    @property
    def window_s(self) -> float: ...
    @property
    def initial_s(self) -> float: ...
    @property
    def factor(self) -> float: ...
    @property
    def max_s(self) -> float: ...
    @property
    def jitter(self) -> float: ...
    @property
    def stable_after_s(self) -> float: ...
    @property
    def slow_retry_s(self) -> float: ...
    @property
    def immediate_first(self) -> bool: ...


@dataclass(frozen=True, slots=True)
class RestartDecision:
    """Whether to restart now (after `delay_s`) or go to `failed`; `slow_retry` schedules a late retry."""

    allowed: bool
    delay_s: float
    reason: str
    slow_retry: bool = False


def is_stable(serving_since: float | None, now: float, cfg: RestartParams) -> bool:
    """True when the server has been serving long enough to reset its restart streak."""
    return serving_since is not None and now - serving_since >= cfg.stable_after_s


def backoff_delay(n: int, cfg: RestartParams, rand: float) -> float:
    """Delay before restart number `n + 1` of a streak: initial·factorⁿ with ±jitter, capped at max_s.

    `rand` is a uniform draw in [0, 1); 0.5 means no jitter.
    """
    base = cfg.initial_s * cfg.factor ** min(n, 64)
    return min(cfg.max_s, base * (1.0 + cfg.jitter * (2.0 * rand - 1.0)))


def _slow_retrying(history: Sequence[float], cfg: RestartParams) -> bool:
    """True if the streak spent its budget and was restarted since (only a slow retry does that).

    Spent = `restarts` consecutive restarts within one window; any later restart was a slow retry.
    """
    times = sorted(history)
    k = cfg.restarts
    if k == 0:
        return bool(times)
    return any(times[i + k - 1] - times[i] < cfg.window_s for i in range(len(times) - k))


def decide_restart(history: Sequence[float], now: float, cfg: RestartParams, rand: float) -> RestartDecision:
    """Decide the next restart of a server that just faulted, given the restart times of its streak."""
    recent = sum(1 for t in history if now - t < cfg.window_s)
    if _slow_retrying(history, cfg) or recent >= cfg.restarts:
        spent = f"restart budget spent ({cfg.restarts} within {cfg.window_s:g}s)"
        if cfg.slow_retry_s <= 0:
            return RestartDecision(False, 0.0, f"{spent}; failed, slow retry off")
        delay = cfg.slow_retry_s * (1.0 + cfg.jitter * (2.0 * rand - 1.0))
        return RestartDecision(False, delay, f"{spent}; failed, slow retry in {delay:.0f}s", slow_retry=True)
    if not history and cfg.immediate_first:
        return RestartDecision(True, 0.0, f"restart 1 of {cfg.restarts} within {cfg.window_s:g}s; at once")
    delay = backoff_delay(len(history) - (1 if cfg.immediate_first else 0), cfg, rand)
    reason = f"restart {recent + 1} of {cfg.restarts} within {cfg.window_s:g}s; backoff {delay:.1f}s"
    return RestartDecision(True, delay, reason)
