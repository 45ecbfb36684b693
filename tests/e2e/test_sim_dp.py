"""The simulator at `--dp-size 2` as the real SGLang 0.5.23 server shows it (docs/contracts.md, "Data parallelism",
checked by `benchmarks/fidelity_diff.py --sections dp2`)."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from http.client import HTTPException
from pathlib import Path
from typing import Any

from tests.support.http import http
from tests.support.sim import Sim, launched_sim
from tests.support.wait import wait_for

DP2 = ("--dp-size", "2", "--enable-metrics")
GENERATE = {"text": "hello", "sampling_params": {"max_new_tokens": 8}}


def rank_tokens(sim: Sim) -> dict[str, float]:
    """Each DP rank's `realtime_tokens_total` (summed over modes)."""
    out: dict[str, float] = {}
    for key, value in sim.metrics().items():
        if key.startswith("sglang:realtime_tokens_total{"):
            rank = key.split('dp_rank="')[1].split('"')[0]
            out[rank] = out.get(rank, 0.0) + value
    return out


def stamps(sim: Sim) -> dict[int, float]:
    return {e["dp_rank"]: e["timestamp"] for e in sim.get("/v1/loads").json()["loads"]}


def post_quietly(sim: Sim, body: dict[str, Any]) -> None:
    """A `/generate` whose end (the server torn down under it) does not matter."""
    with contextlib.suppress(OSError, HTTPException):
        http(sim.base_url + "/generate", "POST", body, 120)


def lagging(sim: Sim) -> dict[int, float] | None:
    """The ranks' snapshot times once rank 1's is more than 2 s behind rank 0's."""
    now = stamps(sim)
    return now if now[0] - now[1] > 2.0 else None


def test_each_dp_rank_has_its_load_its_metrics_and_takes_requests_routed_to_it(tmp_path: Path) -> None:
    """`/v1/loads` has one entry per rank (the real body's keys), every scheduler metric a `dp_rank` label and the
    tokenizer's none; `routed_dp_rank` 1 moves only rank 1's counter; a rank that does not exist is a 400 with
    SGLang's message."""
    with launched_sim(tmp_path, *DP2) as sim:
        titles = {"sglang::data_parallel_controller", "sglang::scheduler_DP0", "sglang::scheduler_DP1"}
        assert titles <= set(sim.tree())
        body = sim.get("/v1/loads").json()
        assert sorted(body) == ["accelerator", "loads", "num_accelerators", "timestamp", "version"]
        assert [e["dp_rank"] for e in body["loads"]] == [0, 1]
        metrics = sim.metrics()
        assert all(
            'dp_rank="' in k for k in metrics if k.startswith(("sglang:num_running_reqs{", "sglang:token"))
        )
        assert not any('dp_rank="' in k for k in metrics if k.startswith("sglang:http_requests_total{"))
        before = rank_tokens(sim)
        assert sim.post("/generate", {**GENERATE, "routed_dp_rank": 1}).status == 200
        after = rank_tokens(sim)
        assert after["1"] > before.get("1", 0.0) and after["0"] == before["0"]
        wrong = sim.post("/generate", {**GENERATE, "routed_dp_rank": 2})
        assert (
            wrong.status == 400 and wrong.json()["error"]["message"] == "routed_dp_rank=2 out of range [0, 2)"
        )


def test_a_stopped_dp_rank_freezes_its_snapshot_while_the_other_serves(tmp_path: Path) -> None:
    """DP rank 1 stopped with a request in flight: a request routed to rank 0 is served, `/v1/loads` still answers
    with rank 1's snapshot frozen (its request running) and rank 0's moving; `/health` takes the ranks in turn:
    503 after SGLang's health timeout on the stopped one, 200 at once on the other."""
    with launched_sim(tmp_path, *DP2, env={"SGLANG_SIM_STEP_S": "0.05"}) as sim:
        long = {"text": "hello", "sampling_params": {"max_new_tokens": 3000, "ignore_eos": True}}
        threading.Thread(target=post_quietly, args=(sim, {**long, "routed_dp_rank": 1}), daemon=True).start()
        rank = sim.tree()["sglang::scheduler_DP1"]
        wait_for(
            lambda: sim.get("/v1/loads").json()["loads"][1]["num_running_reqs"] == 1, 30, "rank 1 running"
        )
        os.kill(rank.pid, signal.SIGSTOP)
        try:
            frozen = wait_for(lambda: lagging(sim), 30, "rank 1 lagging")
            assert sim.post("/generate", {**GENERATE, "routed_dp_rank": 0}).status == 200
            later = stamps(sim)
            assert later[1] == frozen[1] and later[0] > frozen[0]
            assert sim.get("/v1/loads").json()["loads"][1]["num_running_reqs"] == 1
            codes = []
            for _ in range(2):
                start = time.monotonic()
                codes.append((sim.get("/health", timeout=40).status, time.monotonic() - start > 10))
            assert sorted(codes) == [(200, False), (503, True)]
        finally:
            os.kill(rank.pid, signal.SIGCONT)


def test_with_dp_attention_the_dp_ranks_split_the_tp_group(tmp_path: Path) -> None:
    """`--tp-size 2 --dp-size 2 --enable-dp-attention`: two schedulers, each its attention-DP rank and its TP rank in
    its title (as the real server titles them), under the DP controller; two `/v1/loads` entries."""
    with launched_sim(tmp_path, "--tp-size", "2", "--enable-dp-attention", *DP2) as sim:
        schedulers = sorted(t for t in sim.tree() if t.startswith("sglang::scheduler"))
        assert schedulers == ["sglang::scheduler_DP0_TP0", "sglang::scheduler_DP1_TP1"]
        assert "sglang::data_parallel_controller" in sim.tree()
        assert [e["dp_rank"] for e in sim.get("/v1/loads").json()["loads"]] == [0, 1]


def test_with_dp_attention_one_stuck_rank_holds_every_rank(tmp_path: Path) -> None:
    """`dp_rank_wedge` under DP attention: the ranks share the MoE collectives, so once DP rank 1 is stuck DP rank 0
    stops at its next step too — both snapshots stand still and none lags the other (a whole-server wedge)."""
    scenario = tmp_path / "scenario.toml"
    scenario.write_text('[[fault]]\nname = "dp_rank_wedge"\nafter_requests = 1\n')
    env = {"SGLANG_SIM_SCENARIO": str(scenario), "SGLANG_SIM_STEP_S": "0.05"}
    with launched_sim(tmp_path, "--tp-size", "2", "--enable-dp-attention", *DP2, env=env) as sim:
        for rank in (1, 0):
            long = {"text": "hi", "sampling_params": {"max_new_tokens": 3000, "ignore_eos": True}}
            threading.Thread(
                target=post_quietly, args=(sim, {**long, "routed_dp_rank": rank}), daemon=True
            ).start()
        before = wait_for(lambda: both_stand(sim), 30, "both ranks standing")
        assert abs(before[0] - before[1]) < 2.0, before


def both_stand(sim: Sim) -> dict[int, float] | None:
    """Each rank's snapshot time once neither has moved for 2 s."""
    first = stamps(sim)
    time.sleep(2.0)  # the reading's own window: a live rank writes its snapshot every 0.2 s
    return first if stamps(sim) == first else None


def test_a_killed_dp_rank_ends_the_server(tmp_path: Path) -> None:
    """SIGKILL of DP rank 1's scheduler: the DP controller sees it and takes the whole server down (SGLang cannot
    run with a rank missing; its crash path then waits for CUDA core dumps), as the supervisor's crash rule
    expects — the lost rank is what it acts on, long before that."""
    with launched_sim(tmp_path, *DP2) as sim:
        os.kill(sim.tree()["sglang::scheduler_DP1"].pid, signal.SIGKILL)
        sim.wait_log("DataParallelController hit an exception: scheduler exited with code -9")
        sim.wait_log("SIGQUIT received")
