"""A brownout from the load trend of the scrapes (probes/load.py), judged by `policies.brownout`: alert by
default, a restart only by policy; a slow-but-keeping-up server and a surge being served are not one."""

from __future__ import annotations

import pytest

from policies.backoff import RestartDecision
from policies.diagnose import DiagnoseContext, diagnose
from policies.model import Observation, ProbeSettings
from policies.plan import plan_recovery
from probes.load import LoadTrend
from probes.progress import Sample, parse_metrics

pytestmark = pytest.mark.unit
S = ProbeSettings(brownout_after_s=60.0)
CTX = DiagnoseContext("serving", "unified", 0.0, S, healthy_once=True)


def scrape(queue: float, running: float, tokens: float) -> list[Sample]:
    return parse_metrics(
        f'sglang:num_queue_reqs{{tp_rank="0"}} {queue}\nsglang:num_running_reqs{{tp_rank="0"}} {running}\n'
        f'sglang:realtime_tokens_total{{tp_rank="0",mode="decode"}} {tokens}\n'
    )


def reading(slow: list[tuple[float, float, float]], healthy_s: float = 60) -> Observation:
    """`healthy_s` of 100 tokens/s with 4 running, then a scrape every 5 s of (queue, running, tokens/s): the last
    `load` observation."""
    t, tokens, trend = 0.0, 0.0, LoadTrend()
    last = None
    for queue, running, rate in [(0.0, 4.0, 100.0)] * int(healthy_s / 5) + slow:
        last = trend.update(scrape(queue, running, tokens), t, S.brownout_after_s)
        t, tokens = t + 5, tokens + rate * 5
    assert last is not None
    return last


GROWING = [(float(q), 2.0, 10.0) for q in range(0, 30, 2)]  # 75 s, the queue up 28, throughput a tenth


def test_a_queue_growing_behind_a_pinned_batch_at_a_tenth_of_its_baseline_is_a_brownout() -> None:
    obs = reading(GROWING)
    fault = diagnose([obs], CTX, obs.at)
    assert fault is not None and fault.kind == "brownout"
    assert "queue grew by 24 to 28" in fault.reason and "against a baseline of 100.0" in fault.reason


@pytest.mark.parametrize(
    "slow",
    [
        [(float(q), 4.0, 90.0) for q in range(0, 30, 2)],  # a surge served at full speed: not slow
        [(2.0, 2.0, 10.0)] * 15,  # slow, but the queue steady: keeping up
        [(float(q), 2.0 + q % 4 // 2, 10.0) for q in range(0, 30, 2)],  # the batch moves
        [(float(q if q < 20 else 5), 2.0, 10.0) for q in range(0, 30, 2)],  # the queue drained
        [(float(q), 2.0, 10.0) for q in range(0, 10, 2)],  # 25 s: less than the window
    ],
)
def test_no_brownout_unless_every_sign_holds(slow: list[tuple[float, float, float]]) -> None:
    obs = reading(slow)
    assert diagnose([obs], CTX, obs.at) is None


def test_a_brownout_alerts_by_default_and_restarts_only_by_policy() -> None:
    ok = RestartDecision(True, 0.5, "restart 1 of 5")
    assert plan_recovery("brownout", None, (), {}, {}, ok).action == "alert"
    assert plan_recovery("brownout", None, (), {}, {}, ok, brownout_policy="restart").action == "relaunch"


def test_a_paused_engine_is_no_brownout() -> None:
    obs = reading(GROWING)
    pause = Observation("engine", obs.at, True, "paused", 0.01, {"paused": True, "paused_since": obs.at - 5})
    assert diagnose([pause, obs], CTX, obs.at) is None
