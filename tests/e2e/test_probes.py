"""Probes and diagnosis against the simulator: health codes, canaries, a TP desync wedge, a long prefill."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from policies.diagnose import DiagnoseContext, diagnose
from policies.model import Fault, ProbeSettings
from policies.triage import ServerFacts, TreeFacts, Triage, triage
from probes.canary import tool_canary
from probes.health import probe_health
from probes.monitor import Monitor
from probes.stream_canary import stream_canary
from tests.support.monitor_feed import MonitorFeed, monitored_sim

KIMI = "moonshotai/Kimi-K2.5"


def monitor_for(sim: MonitorFeed, model: str, settings: ProbeSettings) -> Monitor:
    return Monitor(
        server="test",
        role="unified",
        base_url=sim.base_url,
        model=model,
        settings=settings,
        tree=sim.tree,
        gpu=sim.gpus,
        log_lines=sim.log_lines,
        pids_for_stacks=sim.pids,
    )


async def drive(monitor: Monitor, until: Callable[[float], Any], timeout_s: float) -> Any:
    """Tick the monitor every 0.1 s until `until(now)` is truthy; fail at the deadline."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        now = time.monotonic()
        await monitor.tick(now)
        found = until(now)
        if found:
            return found
        await asyncio.sleep(0.1)
    raise AssertionError(f"condition not reached in {timeout_s}s: {monitor.snapshot()['probes'].keys()}")


def triaged(monitor: Monitor, phase: str, now: float) -> Triage:
    """What the policies make of the monitor's window now, in `phase`."""
    facts = ServerFacts(monitor.role, phase, monitor.started_at, monitor.settings)
    return triage(monitor.window(), TreeFacts(), facts, now)


def health_ok(monitor: Monitor) -> bool:
    """The latest /health probe answered 200."""
    health = monitor.snapshot()["probes"].get("health")
    return bool(health and health["ok"])


async def serve(monitor: Monitor) -> None:
    """Drive until /health is 200 and the canary passed (the server is `serving`)."""
    await drive(monitor, lambda now: triaged(monitor, "starting", now).serving, 30)


async def user_requests(url: str, model: str, n: int) -> list[asyncio.Task[None]]:
    async def one(i: int) -> None:
        body = {
            "model": model,
            "messages": [{"role": "user", "content": f"Tell me story {i}"}],
            "max_tokens": 64,
        }
        async with (
            aiohttp.ClientSession() as session,
            session.post(
                f"{url}/v1/chat/completions", json=body, timeout=aiohttp.ClientTimeout(total=60)
            ) as r,
        ):
            await r.read()

    return [asyncio.ensure_future(one(i)) for i in range(n)]


async def test_health_refused_while_loading_then_503_then_200(tmp_path: Path) -> None:
    """Connection refused while weights load, 503 while warming up, then 200 — in that order."""
    env = {"SGLANG_SIM_STARTUP_S": "1.0", "SGLANG_SIM_STEP_S": "0.3"}
    with monitored_sim(tmp_path, KIMI, "--tool-call-parser", "kimi_k2", env=env) as sim:
        seen: list[str] = []
        deadline = time.monotonic() + 30
        async with aiohttp.ClientSession() as session:
            while time.monotonic() < deadline and "200" not in seen:
                obs = await probe_health(session, sim.base_url, 35)
                label = "refused" if obs.values["refused"] else str(obs.values["status"])
                if not seen or seen[-1] != label:
                    seen.append(label)
                await asyncio.sleep(0.05)
    assert seen == ["refused", "503", "200"]


async def test_canary_passes_with_the_right_parsers_at_under_one_request_per_second(tmp_path: Path) -> None:
    """Kimi-K2.5 with kimi_k2 parsers: config check, reasoning and tool canaries pass; default cadence ≤ 1 req/s."""
    settings = ProbeSettings(expected_tool_parser="kimi_k2", expected_reasoning_parser="kimi_k2")
    with monitored_sim(
        tmp_path, KIMI, "--tool-call-parser", "kimi_k2", "--reasoning-parser", "kimi_k2"
    ) as sim:
        monitor = monitor_for(sim, KIMI, settings)
        try:
            start = time.monotonic()
            await serve(monitor)
            snap = monitor.snapshot()["probes"]
            assert snap["config_check"]["values"]["verdict"] == "pass"
            assert snap["canary_reasoning"]["values"]["verdict"] == "pass"
            assert snap["canary_tool"]["values"]["verdict"] == "pass"
            await drive(monitor, lambda now: now - start >= 20, 30)
            assert triaged(monitor, "serving", time.monotonic()).fault is None
            elapsed = time.monotonic() - start
        finally:
            await monitor.aclose()
        counts = sim.state()["requests_by_endpoint"]
    ours = sum(n for path, n in counts.items() if path not in ("/model_info", "/generate", "/sim/state"))
    print(f"probe requests: {ours} in {elapsed:.1f}s = {ours / elapsed:.2f}/s {counts}")
    assert ours / elapsed <= 1.0, counts


@pytest.mark.parametrize(
    ("model", "flags", "marker"),
    [
        (KIMI, (), "<|tool_calls_section_begin|>"),
        ("deepseek-ai/DeepSeek-V3.1", ("--tool-call-parser", "deepseekv3"), "<｜tool▁calls▁begin｜>"),
    ],
)
async def test_misconfigured_parser_fails_the_canary(
    tmp_path: Path, model: str, flags: tuple[str, ...], marker: str
) -> None:
    """Kimi-K2.5 without a parser and DeepSeek-V3.1 with deepseekv3 leak markup: parser_misconfig at startup."""
    with monitored_sim(tmp_path, model, *flags) as sim:
        monitor = monitor_for(sim, model, ProbeSettings())
        try:
            fault = await drive(monitor, lambda now: triaged(monitor, "starting", now).fault, 30)
        finally:
            await monitor.aclose()
    assert fault is not None and fault.kind == "parser_misconfig"
    assert marker in fault.evidence["values"]["leaks"]


async def test_overlap_desync_wedge_is_seen_and_stacks_show_diverging_ranks(tmp_path: Path) -> None:
    """F1: /health stays 200, the progress lease sees the stall, py-spy shows TP ranks in different collectives."""
    scenario = tmp_path / "f1.toml"
    scenario.write_text('[[fault]]\nname = "overlap_tp_desync_hang"\nafter_requests = 4\n')
    settings = ProbeSettings(health_period_s=2, metrics_period_s=0.5, stall_after_s=4)
    with monitored_sim(tmp_path, KIMI, "--tool-call-parser", "kimi_k2", scenario=str(scenario)) as sim:
        monitor = monitor_for(sim, KIMI, settings)
        users: list[asyncio.Task[None]] = []
        try:
            await serve(monitor)
            wedge_started = time.monotonic()
            users = await user_requests(sim.base_url, KIMI, 3)
            fault: Fault = await drive(monitor, lambda now: triaged(monitor, "serving", now).fault, 40)
            latency = time.monotonic() - wedge_started
            health = monitor.snapshot()["probes"]["health"]
        finally:
            for task in users:
                task.cancel()
            await monitor.aclose()
    assert fault.kind == "collective_hang", fault
    frames = fault.evidence["stacks"]
    assert {r["collective"] for r in frames.values()} == {"broadcast", "all_reduce"}
    assert set(frames) == {"sglang::scheduler_TP0", "sglang::scheduler_TP1"}
    assert health["ok"], "the busy path keeps /health at 200 during the wedge"
    print(f"F1 detection latency: {latency:.1f}s with stall_after_s={settings.stall_after_s}")


async def test_long_prefill_health_503_is_not_a_fault(tmp_path: Path) -> None:
    """F13: /health 503 during long prefill chunks while the GPU computes is never diagnosed."""
    scenario = tmp_path / "f13.toml"
    scenario.write_text(
        '[[fault]]\nname = "health_false_negative_long_prefill"\nafter_requests = 4\n'
        "params = { chunk_s = 6, duration_s = 14 }\n"
    )
    settings = ProbeSettings(
        health_period_s=1, health_timeout_s=10, health_failures=2, metrics_period_s=0.5,
        stall_after_s=4, unresponsive_after_s=8,
    )  # fmt: skip
    env = {"SGLANG_HEALTH_CHECK_TIMEOUT": "3"}
    with monitored_sim(
        tmp_path, KIMI, "--tool-call-parser", "kimi_k2", scenario=str(scenario), env=env
    ) as sim:
        monitor = monitor_for(sim, KIMI, settings)
        users: list[asyncio.Task[None]] = []
        statuses: set[Any] = set()
        try:
            await serve(monitor)
            users = await user_requests(sim.base_url, KIMI, 3)
            end = time.monotonic() + 16
            faults: list[Fault] = []

            def watch(now: float) -> bool:
                statuses.add(monitor.snapshot()["probes"]["health"]["values"]["status"])
                fault = triaged(monitor, "serving", now).fault
                if fault is not None:
                    faults.append(fault)
                return now >= end

            await drive(monitor, watch, 30)
        finally:
            for task in users:
                task.cancel()
            await monitor.aclose()
    assert 503 in statuses, "the scenario must produce /health false negatives"
    assert faults == []


async def test_leak_only_under_concurrency_is_stream_leak(tmp_path: Path) -> None:
    """F16: the single canary passes, concurrent streams leak markup: stream_leak, alert only."""
    settings = ProbeSettings(stream_canary_concurrency=32, canary_timeout_s=20)
    scenario = "tool_markup_leak_under_load"
    with monitored_sim(tmp_path, KIMI, "--tool-call-parser", "kimi_k2", scenario=scenario) as sim:
        monitor = monitor_for(sim, KIMI, settings)
        try:
            await drive(monitor, lambda now: health_ok(monitor), 30)
        finally:
            await monitor.aclose()
        async with aiohttp.ClientSession() as session:
            single = await tool_canary(session, sim.base_url, KIMI, settings)
            concurrent = await stream_canary(session, sim.base_url, KIMI, settings, single_ok=single.ok)
    assert single.ok
    assert concurrent.values["verdict"] == "fail" and concurrent.values["leaks"]
    ctx = DiagnoseContext("serving", "unified", 0.0, settings)
    fault = diagnose([single, concurrent], ctx, time.monotonic())
    assert fault is not None and fault.kind == "stream_leak"
