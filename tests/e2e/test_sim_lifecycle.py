"""The simulator's process tree, stand-in GPUs, startup phases and shutdown, as an operator observes them."""

from __future__ import annotations

import os
import re
import signal
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.support.http import Response, http
from tests.support.procs import holders, ours
from tests.support.sim import FAST_CRASH, cleanup, launched_sim, start, wait_ready
from tests.support.wait import wait_for

SLOW_GEN = {"SGLANG_SIM_STEP_S": "0.02"}


def _answered(reply: Response) -> Response | None:
    return reply if reply.status else None


def test_tp2_tree_titles_devices_and_gpu_figures(tmp_path: Path) -> None:
    """tp 2: two titled schedulers and a detokenizer under the main PID, each rank holding its GPU; busy vs idle."""
    with launched_sim(tmp_path, "--tp-size", "2", env=SLOW_GEN) as sim:
        procs = sim.tree()
        assert sorted(procs) == ["sglang::detokenizer", "sglang::scheduler_TP0", "sglang::scheduler_TP1"]
        assert all(p.ppid() == sim.pid for p in procs.values())
        for rank in (0, 1):
            device = sim.state_dir / "dev" / f"nvidia{rank}"
            assert holders(device) == {procs[f"sglang::scheduler_TP{rank}"].pid}
        idle = wait_for(
            lambda: (g := sim.nvml()["gpus"]) and all(x["utilization_gpu"] < 10 for x in g) and g, 5, "idle"
        )
        assert [g["pids"] for g in idle] == [
            [procs["sglang::scheduler_TP0"].pid],
            [procs["sglang::scheduler_TP1"].pid],
        ]
        assert all(g["memory_used_mib"] > 0.5 * g["memory_total_mib"] for g in idle)
        with ThreadPoolExecutor(1) as pool:
            reply = pool.submit(
                sim.post,
                "/generate",
                {"text": "hi", "sampling_params": {"max_new_tokens": 150, "ignore_eos": True}},
            )
            wait_for(lambda: all(g["utilization_gpu"] > 80 for g in sim.nvml()["gpus"]), 5, "busy GPUs")
            assert reply.result(timeout=30).status == 200
        wait_for(lambda: all(g["utilization_gpu"] < 10 for g in sim.nvml()["gpus"]), 5, "idle again")


def test_dp2_tp2_tree_under_the_dp_controller(tmp_path: Path) -> None:
    """--dp-size 2 --tp-size 2: a data_parallel_controller parents sglang::scheduler_DP{d}_TP{t}."""
    with launched_sim(tmp_path, "--dp-size", "2", "--tp-size", "2") as sim:
        procs = sim.tree()
        controller = procs["sglang::data_parallel_controller"]
        schedulers = sorted(t for t in procs if t.startswith("sglang::scheduler"))
        assert schedulers == [f"sglang::scheduler_DP{d}_TP{t}" for d in (0, 1) for t in (0, 1)]
        assert all(procs[t].ppid() == controller.pid for t in schedulers)
        assert controller.ppid() == sim.pid and procs["sglang::detokenizer"].ppid() == sim.pid
        held = {n: holders(sim.state_dir / "dev" / f"nvidia{n}") for n in range(4)}
        assert held == {i: {procs[t].pid} for i, t in enumerate(schedulers)}


def test_cuda_visible_devices_and_base_gpu_id_pick_physical_gpus(tmp_path: Path) -> None:
    """CUDA_VISIBLE_DEVICES=4,5,6,7 with --base-gpu-id 1 puts TP0/TP1 on physical GPUs 5 and 6."""
    env = {"CUDA_VISIBLE_DEVICES": "4,5,6,7"}
    with launched_sim(tmp_path, "--tp-size", "2", "--base-gpu-id", "1", env=env) as sim:
        procs = sim.tree()
        assert holders(sim.state_dir / "dev" / "nvidia5") == {procs["sglang::scheduler_TP0"].pid}
        assert holders(sim.state_dir / "dev" / "nvidia6") == {procs["sglang::scheduler_TP1"].pid}
        assert sorted(g["index"] for g in sim.nvml()["gpus"]) == [5, 6]


def test_port_closed_while_loading_then_503_starting_then_ready(tmp_path: Path) -> None:
    """Loading: connection refused + shard lines + memory rising; warmup: 503; then the ready line and 200."""
    env = {"SGLANG_SIM_STARTUP_S": "3", "SGLANG_SIM_WARMUP_S": "3"}
    sim = start(tmp_path, "--tp-size", "2", env=env)
    try:
        sim.wait_log(r"Loading safetensors checkpoint shards:\s+\d+% Completed")
        assert sim.get("/health").status == 0
        memory: list[int] = []

        def loading_sample() -> bool:
            if (sim.state_dir / "nvml.json").exists():
                memory.append(sim.nvml()["gpus"][0]["memory_used_mib"])
            return len(set(memory)) >= 3

        wait_for(loading_sample, 10, "memory samples while loading", interval=0.15)
        assert memory == sorted(memory)
        starting = wait_for(lambda: _answered(sim.get("/health")), 15, "port open")
        assert (starting.status, starting.body) == (503, b"")
        assert "The server is fired up and ready to roll!" not in sim.log()
        wait_ready(sim)
        lines = sim.log()
        assert lines.index("Uvicorn running on") < lines.index("The server is fired up and ready to roll!")
    finally:
        cleanup(sim)


def test_sigterm_503_at_once_drains_then_exits_with_children(tmp_path: Path) -> None:
    """SIGTERM: /health 503 immediately, the in-flight request completes, then the whole tree exits, GPUs freed."""
    with launched_sim(tmp_path, "--tp-size", "2", env={"SGLANG_SIM_STEP_S": "0.03"}) as sim:
        children = list(sim.tree().values())
        with ThreadPoolExecutor(1) as pool:
            body = {"text": "drain me", "sampling_params": {"max_new_tokens": 100, "ignore_eos": True}}
            reply = pool.submit(sim.post, "/generate", body)
            wait_for(lambda: sim.log().count("Prefill batch") >= 2, 10, "the request admitted")
            os.kill(sim.pid, signal.SIGTERM)
            sim.wait_log("SIGTERM received. signum=15")
            health = sim.get("/health", timeout=0.9)
            assert (health.status, health.body) == (503, b"")
            assert "Health check request received during shutdown. Returning 503." in sim.log()
            assert reply.result(timeout=30).status == 200
        assert sim.exited(30) == -signal.SIGKILL
        assert re.search(r"Gracefully exiting\.\.\. Remaining number of requests 1", sim.log())
        assert "kill_process_tree called" in sim.log()
        wait_for(lambda: not any(p.is_running() for p in children), 10, "children gone")
        assert all(g["memory_used_mib"] == 0 and g["pids"] == [] for g in sim.nvml()["gpus"])


def test_killed_rank_tears_down_the_tree_after_the_crash_delay(tmp_path: Path) -> None:
    """A SIGKILLed rank: SubprocessWatchdog line, SIGQUIT, settle + coredump wait (HTTP frozen), then all gone."""
    env = {"SGLANG_CUDA_COREDUMP_BEFORE_CRASH_WAIT_SECS": "2"}
    with launched_sim(tmp_path, "--tp-size", "2", env=env) as sim:
        procs = sim.tree()
        victim = procs["sglang::scheduler_TP1"]
        victim.kill()
        sim.wait_log(
            rf"Subprocess scheduler_1 \(pid={victim.pid}\) crashed with exit code -9\. Triggering SIGQUIT for cleanup"
        )
        sim.wait_log(r"SIGQUIT received\. signum=None.*It usually means one child failed\.")
        sim.wait_log("Sleeping 5 seconds before crash diagnostics to let GPU activity settle.")
        with pytest.raises(TimeoutError):
            http(sim.base_url + "/ping", timeout=1.0)  # the dump blocks the event loop
        sim.wait_log(rf"Pyspy dump for PID {procs['sglang::scheduler_TP0'].pid}", timeout=10)
        sim.wait_log(r"Waiting 2\.0 seconds for CUDA coredumps before exiting\.")
        assert sim.exited(30) == -signal.SIGKILL
        wait_for(lambda: not ours(sim.state_dir), 10, "tree gone")
        assert "kill_process_tree called" in sim.log()


def test_fast_teardown_env_skips_the_crash_delay(tmp_path: Path) -> None:
    """With the py-spy and coredump switches off, a rank death tears the tree down without the diagnostics."""
    with launched_sim(tmp_path, "--tp-size", "2", env=FAST_CRASH) as sim:
        sim.tree()["sglang::scheduler_TP0"].kill()
        assert sim.exited(20) == -signal.SIGKILL
        assert "Sleeping 5 seconds" not in sim.log()
        wait_for(lambda: not ours(sim.state_dir), 10, "tree gone")
