"""The server state machine: the transition table, its checker and the daemon's worst state."""

from __future__ import annotations

import pytest

from policies.states import SEVERITY, TRANSITIONS, FaultKind, ServerState, check_transition, worst

S = ServerState


def test_enums_match_the_contract() -> None:
    """State and fault names are exactly those of docs/contracts.md."""
    states = "stopped starting serving degraded recovering backoff failed paused stopping"
    faults = (
        "crash startup_failure startup_stalled decode_wedge collective_hang pd_transfer_wedge "
        "parser_misconfig stream_leak oom gpu_fault health_unresponsive pause_overrun request_stuck brownout"
    )
    assert [s.value for s in ServerState] == states.split()
    assert [f.value for f in FaultKind] == faults.split()


def test_every_state_has_a_row_and_a_severity() -> None:
    """The table covers every state, and the severity order ranks every state once."""
    assert set(TRANSITIONS) == set(ServerState)
    assert sorted(SEVERITY) == sorted(ServerState)


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (S.STOPPED, S.STARTING),
        (S.STARTING, S.SERVING),
        (S.SERVING, S.DEGRADED),
        (S.DEGRADED, S.SERVING),
        (S.SERVING, S.RECOVERING),
        (S.DEGRADED, S.RECOVERING),
        (S.STARTING, S.RECOVERING),
        (S.RECOVERING, S.BACKOFF),
        (S.BACKOFF, S.STARTING),
        (S.FAILED, S.STARTING),
        (S.STOPPING, S.STOPPED),
    ],
)
def test_design_path_is_legal(old: ServerState, new: ServerState) -> None:
    """Each edge of DESIGN §4's main path is allowed."""
    assert check_transition(old, new) is None


@pytest.mark.parametrize("old", [s for s in ServerState if s is not S.STOPPING])
def test_any_to_failed_and_paused(old: ServerState) -> None:
    """Any state but a stop in progress may go to failed, and to paused unless already paused."""
    assert check_transition(old, S.FAILED) is None or old is S.FAILED
    assert check_transition(old, S.PAUSED) is None or old is S.PAUSED


def test_stopping_to_paused_is_illegal_and_says_what_is_allowed() -> None:
    """A stop in progress completes first; the reason names the allowed targets."""
    reason = check_transition(S.STOPPING, S.PAUSED)
    assert reason is not None and "failed, stopped" in reason


def test_serving_to_starting_is_illegal() -> None:
    """A serving server reaches starting only through recovering and backoff."""
    assert check_transition(S.SERVING, S.STARTING) is not None
    assert check_transition(S.RECOVERING, S.STARTING) is not None


def test_self_transition_is_reported() -> None:
    """Setting the current state again is reported, not silently accepted."""
    assert check_transition(S.SERVING, S.SERVING) == "already serving"


def test_worst_picks_the_most_severe() -> None:
    """The daemon state is the worst server state: failed beats recovering beats serving."""
    assert worst([S.SERVING, S.DEGRADED]) is S.DEGRADED
    assert worst([S.SERVING, S.RECOVERING, S.STARTING]) is S.RECOVERING
    assert worst([S.PAUSED, S.FAILED, S.SERVING]) is S.FAILED
    assert worst([S.SERVING]) is S.SERVING


def test_worst_of_nothing_raises() -> None:
    """A deployment always has a server, so worst() of no states is an error."""
    with pytest.raises(ValueError):
        worst([])


def test_is_up_only_when_answering() -> None:
    """Only serving and degraded answer traffic."""
    assert {s for s in ServerState if s.is_up} == {S.SERVING, S.DEGRADED}
