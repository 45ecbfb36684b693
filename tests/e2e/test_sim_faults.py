"""One test per fault scenario of the catalog (F1–F18 except the PD ones, in test_sim_pd.py), as an operator sees it."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
import urllib.request
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.support.procs import holders, ours
from tests.support.sim import (
    FAST_CRASH,
    Sim,
    cleanup,
    launched_sim,
    pyspy_dump,
    scenario_file,
    start,
    wait_ready,
)
from tests.support.sim_data import TOOLS
from tests.support.wait import wait_for

FAST = {**FAST_CRASH, "SGLANG_HEALTH_CHECK_TIMEOUT": "2"}
LONG = {"text": "tell me a story", "sampling_params": {"max_new_tokens": 400, "ignore_eos": True}}
MEDIUM = {"text": "tell me a story", "sampling_params": {"max_new_tokens": 48, "ignore_eos": True}}
CHAT = {"model": "Qwen/Qwen3-8B", "messages": [{"role": "user", "content": "What is the weather in Oslo?"}]}


def _scenario(name: str) -> dict[str, str]:
    return {"SGLANG_SIM_SCENARIO": name, **FAST}


HANG_DEADLINE_S = 60.0  # a time trigger (`after_s`) may fire only after many quick requests have gone through


def _hang_one(sim: Sim, pool: ThreadPoolExecutor, body: dict[str, Any] = MEDIUM) -> Future[Any]:
    """Send requests one after another until one stays open (the wedge), returning its future."""
    deadline = time.monotonic() + HANG_DEADLINE_S
    while time.monotonic() < deadline:
        future = pool.submit(sim.post, "/generate", body, 120)
        try:
            future.result(timeout=3)
        except TimeoutError:
            return future
    raise AssertionError(f"no request hung within {HANG_DEADLINE_S:.0f} s")


def _gpus_when(sim: Sim, check: Callable[[dict[str, Any]], bool]) -> list[dict[str, Any]]:
    """Poll nvml.json until every GPU passes `check`; the GPUs."""

    def probe() -> list[dict[str, Any]] | None:
        gpus: list[dict[str, Any]] = sim.nvml()["gpus"]
        return gpus if all(check(g) for g in gpus) else None

    return wait_for(probe, 5, "GPU figures")


def _ranks(sim: Sim) -> dict[str, psutil.Process]:
    return {t: p for t, p in sim.tree().items() if t.startswith("sglang::scheduler")}


def test_f1_overlap_tp_desync_hang(tmp_path: Path) -> None:
    """F1: health 200 (busy path), counters and gauges frozen, ranks split broadcast/all_reduce, watchdog teardown."""
    args = ("--tp-size", "2", "--enable-metrics", "--watchdog-timeout", "4")
    with (
        ThreadPoolExecutor(4) as pool,
        launched_sim(tmp_path, *args, env=_scenario("overlap_tp_desync_hang")) as sim,
    ):
        _hang_one(sim, pool)
        first = sim.metrics()
        assert sim.get("/health").status == 200
        second = sim.metrics()
        decode = next(k for k in first if k.startswith("sglang:realtime_tokens_total") and "decode" in k)
        assert first[decode] == second[decode]
        running = next(k for k in first if k.startswith("sglang:num_running_reqs{"))
        assert first[running] == second[running] > 0
        assert second['sglang:http_requests_active{endpoint="/generate",method="POST"}'] >= 1
        gpus = _gpus_when(sim, lambda g: g["index"] == 1 or g["utilization_gpu"] > 98)
        assert gpus[1]["utilization_gpu"] < 10  # N-1 GPUs spin, one idles
        ranks = _ranks(sim)
        assert "broadcast" in pyspy_dump(ranks["sglang::scheduler_TP0"].pid)
        assert "all_reduce" in pyspy_dump(ranks["sglang::scheduler_TP1"].pid)
        sim.wait_log(r"Scheduler watchdog timeout \(self\.watchdog_timeout=4\.0, self\.soft=False\)", 15)
        assert "Pyspy dump for PID" in sim.log()
        sim.wait_log("SIGQUIT received", 15)
        assert sim.exited(20) == -signal.SIGKILL
        wait_for(lambda: not ours(sim.state_dir), 10, "tree gone")


def test_f2_watchdog_disabled_silent_wedge(tmp_path: Path) -> None:
    """F2: health 503 after the timeout, no watchdog even past its timeout, the tree stays up."""
    args = ("--tp-size", "2", "--watchdog-timeout", "1")
    with (
        ThreadPoolExecutor(4) as pool,
        launched_sim(tmp_path, *args, env=_scenario("watchdog_disabled_silent_wedge")) as sim,
    ):
        _hang_one(sim, pool)
        assert sim.get("/health").status == 503
        assert sim.get("/health").status == 503
        sim.wait_log("Health check failed")
        assert "watchdog timeout" not in sim.log()
        assert sim.proc.poll() is None and len(_ranks(sim)) == 2
        assert sim.get("/model_info").status == 200
        with pytest.raises(TimeoutError):
            sim.get("/server_info", timeout=2)  # a scheduler round-trip hangs


def test_f6_custom_allreduce_spin_sigterm_immune(tmp_path: Path) -> None:
    """F6: GPUs at 100 % on idle power; SIGTERM leaves main draining and ranks spinning; SIGKILL frees the GPUs."""
    with (
        ThreadPoolExecutor(4) as pool,
        launched_sim(
            tmp_path, "--tp-size", "2", env=_scenario("custom_allreduce_spin_sigterm_immune")
        ) as sim,
    ):
        _hang_one(sim, pool)
        gpus = _gpus_when(sim, lambda g: g["utilization_gpu"] >= 99)
        assert all(g["power_w"] < 0.3 * g["power_limit_w"] for g in gpus)
        assert sim.get("/health").status == 200
        os.kill(sim.pid, signal.SIGTERM)
        sim.wait_log(r"Gracefully exiting\.\.\. Remaining number of requests 1")
        assert sim.get("/health").status == 503
        for proc in _ranks(sim).values():
            proc.send_signal(signal.SIGTERM)
            assert "custom_all_reduce" in pyspy_dump(proc.pid)  # still alive, still spinning
        assert sim.proc.poll() is None
        os.killpg(sim.pid, signal.SIGKILL)
        wait_for(lambda: not ours(sim.state_dir), 10, "tree gone")
        assert holders(sim.state_dir / "dev" / "nvidia0") == set()


def test_f7_spec_decode_kernel_spin_on_long_outputs_only(tmp_path: Path) -> None:
    """F7: with speculative decoding a short request passes, a long one spins in the verify kernel; health 200."""
    args = ("--tp-size", "2", "--speculative-algorithm", "EAGLE")
    with (
        ThreadPoolExecutor(2) as pool,
        launched_sim(tmp_path, *args, env=_scenario("spec_decode_kernel_spin")) as sim,
    ):
        short = {"text": "hi", "sampling_params": {"max_new_tokens": 8, "ignore_eos": True}}
        assert sim.post("/generate", short).status == 200
        _hang_one(sim, pool, {"text": "long", "sampling_params": {"max_new_tokens": 300, "ignore_eos": True}})
        assert sim.get("/health").status == 200
        assert "tree_speculative_sampling_target_only" in pyspy_dump(_ranks(sim)["sglang::scheduler_TP0"].pid)


def test_f8_runtime_cuda_oom_crash_after_n_requests(tmp_path: Path) -> None:
    """F8 (TOML after_requests): the OOM traceback, the scheduler exception, SIGQUIT teardown, tree gone."""
    path = scenario_file(tmp_path, '[[fault]]\nname = "runtime_cuda_oom_crash"\nafter_requests = 3\n')
    with launched_sim(tmp_path, "--tp-size", "2", env=_scenario(path)) as sim:
        assert sim.post("/generate", {"text": "one"}).status == 200  # requests 1 (warmup) and 2 pass
        with pytest.raises(ConnectionError):
            sim.post("/generate", {"text": "two"})
        log = sim.log()
        assert "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 616.00 MiB" in log
        assert "Scheduler hit an exception: Traceback" in log
        sim.wait_log("SIGQUIT received")
        sim.exited(20)
        wait_for(lambda: not ours(sim.state_dir), 10, "tree gone")


def test_f9_illegal_memory_access_at_concurrency(tmp_path: Path) -> None:
    """F9 (TOML concurrency_ge): IMA lines, rank exit -6 seen by the SubprocessWatchdog, Xid 13 in nvml.json."""
    path = scenario_file(tmp_path, '[[fault]]\nname = "illegal_memory_access"\nconcurrency_ge = 4\n')
    env = {**_scenario(path), "SGLANG_SIM_STEP_S": "0.05"}
    with ThreadPoolExecutor(6) as pool, launched_sim(tmp_path, "--tp-size", "2", env=env) as sim:
        futures = [pool.submit(sim.post, "/generate", LONG, 60) for _ in range(6)]
        sim.wait_log("CUDA error: an illegal memory access was encountered")
        sim.wait_log(r"Subprocess scheduler_0 \(pid=\d+\) crashed with exit code -6")
        assert "Fatal Python error: Aborted" in sim.log()
        sim.exited(20)
        assert any(e["xid"] == 13 for g in sim.nvml()["gpus"] for e in g["xid_events"])
        for future in futures:
            with pytest.raises(ConnectionError):
                future.result(timeout=10)


def test_f10_zombie_after_cpp_abort(tmp_path: Path) -> None:
    """F10 (TOML after_s): a rank aborts unseen; HTTP lives on, chat hangs, health 503, one scheduler missing."""
    path = scenario_file(tmp_path, '[[fault]]\nname = "zombie_after_cpp_abort"\nafter_s = 5\n')
    with ThreadPoolExecutor(2) as pool, launched_sim(tmp_path, "--tp-size", "2", env=_scenario(path)) as sim:
        _hang_one(sim, pool)
        wait_for(lambda: len(_ranks(sim)) == 1, 10, "a scheduler gone")
        assert sim.get("/health").status == 503
        assert sim.get("/ping").status == 503 and sim.proc.poll() is None  # unhealthy since /health failed
        with pytest.raises(TimeoutError):
            sim.post("/v1/chat/completions", CHAT, timeout=3)
        assert "crashed with exit code" not in sim.log()


def test_f11_orphans_hold_gpu_and_ports_after_a_parent_kill(tmp_path: Path) -> None:
    """F11: SIGKILL of the main PID only leaves ranks reparented, holding GPUs and the rpc port; relaunch fails."""
    sim = start(tmp_path, "--tp-size", "2", env=_scenario("orphans_hold_gpu_and_ports"))
    try:
        wait_ready(sim)
        ranks = _ranks(sim)
        os.kill(sim.pid, signal.SIGKILL)
        sim.exited(10)
        wait_for(lambda: all(p.ppid() != sim.pid for p in ranks.values()), 10, "ranks reparented")
        assert all(p.is_running() for p in ranks.values())
        assert holders(sim.state_dir / "dev" / "nvidia0") == {ranks["sglang::scheduler_TP0"].pid}
        again = start(
            tmp_path, "--tp-size", "2", env=FAST, port=sim.port, state_dir=sim.state_dir, name="again"
        )
        try:
            assert again.exited(20) != 0
            log = again.log()
            assert (
                f"zmq.error.ZMQError: Address already in use (addr='tcp://127.0.0.1:{sim.port + 2}')" in log
            )
            assert "Rank 0 scheduler died during initialization" in log
        finally:
            cleanup(again)
    finally:
        cleanup(sim)


def test_f12_dev_shm_crashloop_until_swept(tmp_path: Path) -> None:
    """F12: a crash leaks sgl_shm_* files; every relaunch dies of SIGBUS until they are swept."""
    with launched_sim(tmp_path, "--tp-size", "2", env=_scenario("dev_shm_crashloop")) as sim:
        with pytest.raises(ConnectionError):
            sim.post("/generate", {"text": "boom"})
        sim.exited(20)
    shm = tmp_path / "state" / "shm"
    assert len(list(shm.glob("sgl_shm_*"))) > 0
    again = start(tmp_path, "--tp-size", "2", env=FAST, name="again")
    try:
        assert again.exited(20) != 0
        assert "Fatal Python error: Bus error" in again.log()
        assert "Rank 0 scheduler died during initialization (exit code: -7)" in again.log()
    finally:
        cleanup(again)
    for leaked in shm.glob("sgl_shm_*"):
        leaked.unlink()
    with launched_sim(tmp_path, "--tp-size", "2", env=FAST, name="swept") as swept:
        assert swept.post("/generate", {"text": "ok"}).status == 200


def test_f13_long_prefill_health_false_negative_with_progress(tmp_path: Path) -> None:
    """F13 (TOML prompt_tokens_ge): 503 with the health line while prefill lines and prefill tokens advance."""
    text = '[[fault]]\nname = "health_false_negative_long_prefill"\nprompt_tokens_ge = 2000\n[fault.params]\nchunk_s = 2.5\nduration_s = 30\n'
    env = {**_scenario(scenario_file(tmp_path, text)), "SGLANG_HEALTH_CHECK_TIMEOUT": "1"}
    with (
        ThreadPoolExecutor(2) as pool,
        launched_sim(tmp_path, "--tp-size", "2", "--enable-metrics", env=env) as sim,
    ):
        assert sim.post("/generate", {"text": "short"}).status == 200
        pool.submit(sim.post, "/generate", {"text": "x " * 6000}, 120)
        chunk = sim.wait_log(r"Prefill batch, #new-seq: \d+, #new-token: 8192")
        before = sim.metrics()
        wait_for(lambda: sim.get("/health").status == 503, 20, "a 503 while prefilling", interval=0)
        sim.wait_log("Health check failed")
        wait_for(lambda: sim.log().count("#new-token: 8192") >= 2, 20, "another prefill chunk")
        key = next(k for k in before if "prefill_compute" in k)
        assert sim.metrics()[key] > before[key] and chunk


def test_f14_health_probe_pileup_crashes(tmp_path: Path) -> None:
    """F14: health probes with a sub-second client timeout leave orphans; the fifth crashes the server."""
    with launched_sim(tmp_path, "--tp-size", "2", env=_scenario("health_probe_pileup")) as sim:
        for _ in range(5):
            with pytest.raises(TimeoutError):
                sim.get("/health", timeout=0.3)
        sim.wait_log(r"q\.shape\[0\] \(1\) does not match qo_indptr\[-1\] \(5\)")
        sim.exited(20)


def test_f15_slow_startup_deepgemm_logs_progress_with_the_port_closed(tmp_path: Path) -> None:
    """F15: DeepGEMM JIT lines while the port is closed, then ready."""
    text = '[[fault]]\nname = "slow_startup_deepgemm"\n[fault.params]\nstartup_s = 3\n'
    sim = start(tmp_path, "--tp-size", "2", env=_scenario(scenario_file(tmp_path, text)))
    try:
        sim.wait_log("Entering DeepGEMM JIT Pre-Compile session")
        wait_for(lambda: sim.log().count("DeepGEMM JIT Compiling") >= 2, 10, "JIT progress")
        assert sim.get("/health").status == 0
        wait_ready(sim)
    finally:
        cleanup(sim)


def test_f16_tool_markup_leaks_in_streams_under_load(tmp_path: Path) -> None:
    """F16 (TOML concurrency_ge): concurrent streams leak raw markup into content; non-stream stays parsed."""
    path = scenario_file(tmp_path, '[[fault]]\nname = "tool_markup_leak_under_load"\nconcurrency_ge = 3\n')
    env = {**_scenario(path), "SGLANG_SIM_STEP_S": "0.05"}
    args = ("--tool-call-parser", "qwen25", "--reasoning-parser", "qwen3")
    with ThreadPoolExecutor(8) as pool, launched_sim(tmp_path, *args, env=env) as sim:
        body = {**CHAT, "tools": TOOLS, "stream": True}
        streams = [
            s.body.decode() for s in pool.map(lambda _: sim.post("/v1/chat/completions", body), range(8))
        ]
        contents = [
            "".join(
                json.loads(e[6:])["choices"][0]["delta"].get("content") or ""
                for e in s.split("\n\n")
                if e.startswith("data: {") and json.loads(e[6:])["choices"]
            )
            for s in streams
        ]
        assert any("<tool_call>" in c for c in contents)
        whole = sim.post("/v1/chat/completions", {**CHAT, "tools": TOOLS}).json()
        assert whole["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "get_weather"


def test_f17_abort_storm_crashes_the_tokenizer(tmp_path: Path) -> None:
    """F17 (TOML disconnects_ge): many clients dropping their streams make the TokenizerManager die."""
    path = scenario_file(tmp_path, '[[fault]]\nname = "abort_storm_tokenizer_crash"\ndisconnects_ge = 4\n')
    env = {**_scenario(path), "SGLANG_SIM_STEP_S": "0.1"}
    with ThreadPoolExecutor(8) as pool, launched_sim(tmp_path, env=env) as sim:

        def drop() -> None:
            req = urllib.request.Request(
                sim.base_url + "/v1/chat/completions",
                json.dumps({**CHAT, "stream": True}).encode(),
                {"Content-Type": "application/json"},
            )
            with contextlib.suppress(OSError), urllib.request.urlopen(req, timeout=10) as resp:
                resp.read(64)  # a client that comes after the crash is refused: the storm did its work

        list(pool.map(lambda _: drop(), range(8)))
        sim.wait_log("TokenizerManager hit an exception")
        assert sim.exited(20) != 0


def test_f18_restart_same_port_hang_after_an_unclean_kill(tmp_path: Path) -> None:
    """F18: after a SIGKILL without cleanup, a relaunch on the port serves N requests, then every request hangs."""
    first = start(tmp_path, env=FAST)
    wait_ready(first)
    cleanup(first)
    text = '[[fault]]\nname = "restart_same_port_hang"\n[fault.params]\nafter_requests = 3\n'
    env = _scenario(scenario_file(tmp_path, text))
    with launched_sim(tmp_path, env=env, port=first.port, name="again") as sim:
        assert [sim.post("/generate", {"text": t}).status for t in ("a", "b")] == [200, 200]
        with pytest.raises(TimeoutError):
            sim.post("/generate", {"text": "c"}, timeout=3)
        assert sim.get("/health").status == 200


def test_recur_until_flag_rearms_on_relaunch_until_the_flag(tmp_path: Path) -> None:
    """A fault injected with recur_until_flag is armed again on relaunch, and not once the flag is passed."""
    env = {"SGLANG_SIM_CONTROL": "1", **FAST}
    fault = {"name": "overlap_tp_desync_hang", "recur_until_flag": "--disable-overlap-schedule"}
    with launched_sim(tmp_path, "--tp-size", "2", env=env) as sim:
        assert sim.post("/sim/fault", fault).json()["armed"] is True
    with launched_sim(tmp_path, "--tp-size", "2", env=env, name="again") as sim:
        state = sim.get("/sim/state").json()
        assert [f["name"] for f in state["active"]] == ["overlap_tp_desync_hang"]
    with launched_sim(tmp_path, "--tp-size", "2", "--disable-overlap-schedule", env=env, name="cured") as sim:
        state = sim.get("/sim/state").json()
        assert state["active"] == []
        assert state["suppressed"] == [
            {"name": "overlap_tp_desync_hang", "cured_by": "--disable-overlap-schedule"}
        ]


def test_bad_scenario_refuses_to_start(tmp_path: Path) -> None:
    """An unknown fault name in SGLANG_SIM_SCENARIO stops the launch with a message and exit 1."""
    sim = start(tmp_path, env={"SGLANG_SIM_SCENARIO": "no_such_fault"})
    try:
        assert sim.exited(20) == 1
        assert "Invalid simulator scenario" in sim.log()
    finally:
        cleanup(sim)
