"""Restart budget and backoff: allowed restarts, exponential delays with jitter and cap, slow retry."""

from __future__ import annotations

from dataclasses import dataclass, replace

from hypothesis import given
from hypothesis import strategies as st

from policies.backoff import backoff_delay, decide_restart, is_stable


@dataclass(frozen=True)
class Params:
    restarts: int = 5
    window_s: float = 600
    initial_s: float = 5
    factor: float = 2
    max_s: float = 300
    jitter: float = 0.2
    stable_after_s: float = 600
    slow_retry_s: float = 1800
    immediate_first: bool = False


CFG = Params()


def test_first_restart_waits_initial_delay() -> None:
    """With immediate_first off, a first fault restarts after initial_s (no jitter at rand=0.5)."""
    d = decide_restart([], now=1000.0, cfg=CFG, rand=0.5)
    assert (d.allowed, d.delay_s, d.slow_retry) == (True, 5.0, False)
    assert "restart 1 of 5" in d.reason


def test_first_restart_of_a_streak_goes_at_once_by_default() -> None:
    """immediate_first (the default): the first restart of a streak has no delay, as Kubernetes restarts."""
    d = decide_restart([], now=1000.0, cfg=replace(CFG, immediate_first=True), rand=0.9)
    assert (d.allowed, d.delay_s) == (True, 0.0)
    assert "at once" in d.reason


def test_immediate_first_still_backs_off_a_crash_loop() -> None:
    """immediate_first: the second and later restarts of a streak wait initial_s, then twice as long."""
    cfg = replace(CFG, immediate_first=True)
    delays = [decide_restart([100.0] * n, now=200.0, cfg=cfg, rand=0.5).delay_s for n in range(1, 4)]
    assert delays == [5.0, 10.0, 20.0]


def test_delays_double_until_the_cap() -> None:
    """Each restart of a streak doubles the delay: 5, 10, 20, 40, 80 … capped at 300 s."""
    assert [backoff_delay(n, CFG, 0.5) for n in range(8)] == [5, 10, 20, 40, 80, 160, 300, 300]


def test_budget_spent_fails_with_slow_retry() -> None:
    """The sixth fault within the window is refused: failed, with a slow retry after slow_retry_s."""
    d = decide_restart([100, 110, 130, 170, 250], now=400.0, cfg=CFG, rand=0.5)
    assert (d.allowed, d.slow_retry, d.delay_s) == (False, True, 1800.0)
    assert "budget spent" in d.reason


def test_budget_spent_without_slow_retry_just_fails() -> None:
    """With slow_retry_s = 0 a spent budget means failed and nothing scheduled."""
    d = decide_restart([100, 110, 130, 170, 250], now=400.0, cfg=replace(CFG, slow_retry_s=0), rand=0.5)
    assert (d.allowed, d.slow_retry, d.delay_s) == (False, False, 0.0)


def test_after_a_slow_retry_the_streak_stays_failed() -> None:
    """A server that crashes again after its slow retry goes back to failed, not to a new burst."""
    history = [100, 110, 130, 170, 250, 2200]
    d = decide_restart(history, now=2300.0, cfg=CFG, rand=0.5)
    assert (d.allowed, d.slow_retry) == (False, True)


def test_restarts_spread_beyond_the_window_stay_allowed() -> None:
    """Restarts older than window_s do not count against the budget."""
    d = decide_restart([0, 700, 1400, 2100], now=2800.0, cfg=CFG, rand=0.5)
    assert d.allowed
    assert d.delay_s == 80.0


def test_zero_budget_never_restarts() -> None:
    """restarts = 0 turns automatic restarts off."""
    assert not decide_restart([], now=0.0, cfg=replace(CFG, restarts=0), rand=0.5).allowed


def test_stable_after_period() -> None:
    """A server serving for stable_after_s is stable (its streak resets); one never serving is not."""
    assert is_stable(100.0, now=700.0, cfg=CFG)
    assert not is_stable(100.0, now=699.0, cfg=CFG)
    assert not is_stable(None, now=1e9, cfg=CFG)


@given(n=st.integers(0, 200), rand=st.floats(0, 1, exclude_max=True))
def test_backoff_is_monotone_and_capped(n: int, rand: float) -> None:
    """For a fixed draw, the delay never shrinks as the streak grows and never exceeds max_s."""
    now, nxt = backoff_delay(n, CFG, rand), backoff_delay(n + 1, CFG, rand)
    assert 0 <= now <= nxt <= CFG.max_s


@given(n=st.integers(0, 5), rand=st.floats(0, 1, exclude_max=True))
def test_jitter_stays_within_its_fraction(n: int, rand: float) -> None:
    """Jitter moves the uncapped delay by at most ±jitter of its base."""
    base = CFG.initial_s * CFG.factor**n
    assert base * 0.8 - 1e-9 <= backoff_delay(n, CFG, rand) <= min(CFG.max_s, base * 1.2 + 1e-9)


@given(history=st.lists(st.floats(0, 10_000), max_size=12), rand=st.floats(0, 1, exclude_max=True))
def test_decision_is_always_explained(history: list[float], rand: float) -> None:
    """Every decision carries a reason, and an allowed restart never waits longer than max_s."""
    d = decide_restart(history, now=10_000.0, cfg=CFG, rand=rand)
    assert d.reason
    assert not d.allowed or d.delay_s <= CFG.max_s
