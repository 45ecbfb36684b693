"""The /health decision table of SGLang 0.5.23 (sglang-internals.md §1), row by row, on the simulator."""

from __future__ import annotations

import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.support.sim import FAST_CRASH, Sim, launched_sim
from tests.support.wait import wait_for


def _timed(sim: Sim, path: str) -> tuple[int, bytes, float]:
    start = time.monotonic()
    reply = sim.get(path, timeout=30)
    return reply.status, reply.body, time.monotonic() - start


def _stop_ranks(sim: Sim, sig: signal.Signals) -> None:
    for name, proc in sim.tree().items():
        if name.startswith("sglang::scheduler"):
            os.kill(proc.pid, sig)


def test_healthy_health_and_health_generate_take_a_second_with_an_empty_body(tmp_path: Path) -> None:
    """Up: both routes generate and answer 200, empty body, no sooner than the handler's 1 s sleep."""
    with launched_sim(tmp_path, "--tp-size", "2") as sim:
        for path in ("/health", "/health_generate"):
            status, body, elapsed = _timed(sim, path)
            assert (status, body) == (200, b"")
            assert elapsed >= 0.95
        assert sim.get("/ping").status == 200


def test_stalled_scheduler_503_after_the_health_timeout_then_recovers(tmp_path: Path) -> None:
    """Stopped ranks: 503 after SGLANG_HEALTH_CHECK_TIMEOUT with SGLang's line; main-process routes stay 200."""
    env = {"SGLANG_HEALTH_CHECK_TIMEOUT": "2", **FAST_CRASH}
    with launched_sim(tmp_path, "--tp-size", "2", env=env) as sim:
        _stop_ranks(sim, signal.SIGSTOP)
        status, body, _ = _timed(sim, "/health")
        assert (status, body) == (503, b"")
        sim.wait_log(
            r"Health check failed\. Server couldn't get a response from detokenizer for last 2 seconds\. "
            r"tic start time: \d\d:\d\d:\d\d\. last_heartbeat time: \d\d:\d\d:\d\d"
        )
        # /ping is SGLang 0.5.23's is_healthy(): a failed /health marks the server unhealthy until one passes
        assert [sim.get(p).status for p in ("/ping", "/model_info", "/v1/models")] == [503, 200, 200]
        _stop_ranks(sim, signal.SIGCONT)
        assert sim.get("/health").status == 200  # UnHealthy does not block later probes
        assert sim.get("/ping").status == 200


def test_sigterm_while_unhealthy_force_exits(tmp_path: Path) -> None:
    """SIGTERM after a failed health check skips the drain: 'Force exiting.' and the tree goes."""
    env = {"SGLANG_HEALTH_CHECK_TIMEOUT": "1", **FAST_CRASH}
    with launched_sim(tmp_path, "--tp-size", "2", env=env) as sim:
        _stop_ranks(sim, signal.SIGSTOP)
        with ThreadPoolExecutor(1) as pool:
            stuck = pool.submit(sim.post, "/generate", {"text": "x"}, 30)
            assert sim.get("/health").status == 503
            os.kill(sim.pid, signal.SIGTERM)
            sim.wait_log("Signal SIGTERM received while health check failed. Force exiting.")
            _stop_ranks(sim, signal.SIGCONT)  # let the ranks take the ShutdownReq instead of the 15 s wait
            assert sim.exited(20) == -signal.SIGKILL
            with pytest.raises(ConnectionError):
                stuck.result(timeout=10)


def test_generation_disabled_health_is_instant_but_health_generate_generates(tmp_path: Path) -> None:
    """SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION=0: /health 200 even with stopped ranks; /health_generate 503."""
    env = {"SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION": "0", "SGLANG_HEALTH_CHECK_TIMEOUT": "2"}
    with launched_sim(tmp_path, "--tp-size", "2", env=env) as sim:
        _stop_ranks(sim, signal.SIGSTOP)
        status, _, elapsed = _timed(sim, "/health")
        assert status == 200 and elapsed < 0.9
        assert _timed(sim, "/health_generate")[0] == 503
        _stop_ranks(sim, signal.SIGCONT)


def test_busy_with_slow_forwards_gives_a_false_503(tmp_path: Path) -> None:
    """Forwards longer than the health timeout: /health 503 while the request still completes fine."""
    env = {"SGLANG_HEALTH_CHECK_TIMEOUT": "1", "SGLANG_SIM_STEP_S": "1.5"}
    with (
        ThreadPoolExecutor(1) as pool,
        launched_sim(tmp_path, "--tp-size", "2", "--skip-server-warmup", env=env) as sim,
    ):
        body = {"text": "slow", "sampling_params": {"max_new_tokens": 3, "ignore_eos": True}}
        reply = pool.submit(sim.post, "/generate", body, 60)
        wait_for(lambda: sim.get("/health").status == 503, 20, "a false 503 while busy", interval=0)
        assert reply.result(timeout=60).status == 200
