"""One DP rank wedged while its peers serve: the lag of its `/v1/loads` snapshot (probes/loads.py) judged by
`policies.dp` through `diagnose`."""

from __future__ import annotations

import json

import pytest

from policies.diagnose import DiagnoseContext, diagnose
from policies.model import Observation, ProbeSettings
from probes.loads import RankLoad, dp_observation, parse_loads, pd_summary

pytestmark = pytest.mark.unit
S = ProbeSettings(dp_size=2)
CTX = DiagnoseContext("serving", "unified", 0.0, S, healthy_once=True)
NOW = 5000.0
WALL = 1_796_470_000.0


def reading(*stamps: float, running: float = 1.0) -> Observation:
    """A `dp` observation of ranks whose snapshots were written at `stamps` (wall clock)."""
    ranks = [RankLoad(i, t, running if i else 0.0, 0.0) for i, t in enumerate(stamps)]
    return dp_observation(ranks, NOW)


def test_the_lag_is_each_snapshots_age_against_the_newest() -> None:
    """Lag needs no scrape interval: rank 1's snapshot 7 s older than rank 0's lags 7 s; an unpublished rank
    (timestamp 0) lags nothing."""
    ranks = reading(WALL, WALL - 7.0).values["ranks"]
    assert (ranks["0"]["lag_s"], ranks["1"]["lag_s"]) == (0.0, 7.0)
    assert reading(WALL, 0.0).values["ranks"]["1"]["lag_s"] == 0.0


def test_a_rank_lagging_past_the_window_is_a_decode_wedge_naming_it() -> None:
    fault = diagnose([reading(WALL, WALL - 7.0)], CTX, NOW)
    assert fault is not None and fault.kind == "decode_wedge"
    assert fault.evidence["dp_rank"] == 1 and fault.evidence["tags"] == ["dp_rank_wedged"]
    assert (
        fault.reason
        == "DP rank 1 made no progress for 7.0s (1 running, 0 waiting as of its last snapshot) while DP0 serves"
    )
    assert fault.onset_at == NOW - 7.0


@pytest.mark.parametrize(
    "stamps",
    [
        (WALL, WALL - 5.9),  # slow but moving: a step shorter than the window
        (WALL - 30.0, WALL - 30.0),  # every rank stands still: the whole-server rules judge it
        (WALL,),  # one rank: nothing to compare with
    ],
)
def test_no_rank_wedge_without_a_rank_behind_a_moving_peer(stamps: tuple[float, ...]) -> None:
    assert diagnose([reading(*stamps)], CTX, NOW) is None


def test_the_most_lagging_of_several_ranks_is_named_and_the_movers_listed() -> None:
    fault = diagnose([reading(WALL, WALL - 9.0, WALL - 12.0, WALL - 0.2)], CTX, NOW)
    assert fault is not None and fault.evidence["dp_rank"] == 2
    assert fault.evidence["dp"]["stuck"] == ["1", "2"] and "while DP0, DP3 serve" in fault.reason


def test_a_paused_engine_is_no_rank_wedge() -> None:
    """`/pause_generation` stops every rank's loop on purpose: the lease rules stand aside."""
    pause = Observation("engine", NOW, True, "paused", 0.01, {"paused": True, "paused_since": NOW - 60})
    assert diagnose([pause, reading(WALL, WALL - 60.0)], CTX, NOW) is None


def test_the_rank_window_is_a_setting() -> None:
    tight = DiagnoseContext("serving", "unified", 0.0, ProbeSettings(dp_size=2, rank_stall_after_s=3.0), True)
    assert diagnose([reading(WALL, WALL - 4.0)], tight, NOW) is not None
    assert diagnose([reading(WALL, WALL - 4.0)], CTX, NOW) is None


def test_a_loads_body_as_the_real_server_writes_it_parses_per_rank() -> None:
    """Keys and sections of SGLang 0.5.23's `/v1/loads` (the fidelity record); a body that is not one is None."""
    body = {
        "timestamp": "2026-12-05T11:24:06+00:00",
        "version": "0.5.23",
        "accelerator": None,
        "num_accelerators": 1,
        "loads": [
            {
                "timestamp": WALL,
                "dp_rank": 0,
                "num_running_reqs": 2,
                "num_waiting_reqs": 1,
                "queues": {"waiting": 1},
            },
            {
                "timestamp": WALL - 1,
                "dp_rank": 1,
                "num_running_reqs": 1,
                "disaggregation": {"mode": "decode", "decode_transfer_queue_reqs": 3},
            },
        ],
    }
    ranks = parse_loads(json.dumps(body).encode())
    assert ranks is not None and [(r.dp_rank, r.running, r.waiting) for r in ranks] == [(0, 2, 1), (1, 1, 0)]
    summary = pd_summary(ranks, "decode")
    assert summary is not None and (summary.queue, summary.waiting, summary.running) == (3.0, 3.0, 3.0)
    assert parse_loads(b"[1, 2]") is None and parse_loads(b"not json") is None
