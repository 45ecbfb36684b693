"""Every HTTP probe against a server that lies: each ends within its timeout with a failure observation."""

from __future__ import annotations

import asyncio
import tracemalloc
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
import pytest

from policies.model import Observation, ProbeSettings
from probes.canary import config_check, reasoning_canary, tool_canary
from probes.health import probe_health
from probes.progress import ProgressTracker, scrape_metrics
from probes.stream_canary import stream_canary
from tests.hardening.hostile import HostileServer

pytestmark = pytest.mark.hardening

TIMEOUT_S = 3.0
# aiohttp rounds timeouts of 5 s and more up to the next second; below that it is exact, plus scheduling noise
SLACK_S = 2.0
SETTINGS = ProbeSettings(
    health_timeout_s=TIMEOUT_S,
    canary_timeout_s=TIMEOUT_S,
    stream_canary_concurrency=8,
    expected_tool_parser="qwen25",
    expected_reasoning_parser="qwen3",
)
Probe = Callable[[aiohttp.ClientSession, str], Awaitable[Observation]]


async def _metrics(session: aiohttp.ClientSession, url: str) -> Observation:
    samples, error, latency = await scrape_metrics(session, url, TIMEOUT_S, SETTINGS.metrics_max_bytes)
    return ProgressTracker().update(samples, 0.0, error=error, latency_s=latency)


PROBES: dict[str, tuple[Probe, int]] = {  # probe -> (call, how many request timeouts it may take at most)
    "health": (lambda s, u: probe_health(s, u, TIMEOUT_S), 1),
    "config_check": (lambda s, u: config_check(s, u, SETTINGS), 1),
    "canary_tool": (lambda s, u: tool_canary(s, u, "m", SETTINGS), 2),  # non-stream, then stream
    "canary_reasoning": (lambda s, u: reasoning_canary(s, u, "m", SETTINGS), 1),
    "canary_stream": (lambda s, u: stream_canary(s, u, "m", SETTINGS), 1),
    "progress": (_metrics, 1),
}
CHAT = {"config_check", "canary_tool", "canary_reasoning", "canary_stream"}
ATTACKED = {  # mode -> the probes whose answers it corrupts (the others must still end cleanly)
    "invalid_json": CHAT,
    "error_body": CHAT,
    "huge_body": CHAT | {"progress"},
    "drip": CHAT | {"progress"},
    "wrong_content_type": CHAT | {"progress"},
    "broken_sse": CHAT,
    "metrics_million": {"progress"},
    "metrics_truncated": {"progress"},
    "silent": set(PROBES),
}


@pytest.fixture
async def hostile() -> AsyncIterator[HostileServer]:
    server = HostileServer("invalid_json")
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


@pytest.mark.parametrize("mode", sorted(ATTACKED))
async def test_every_probe_fails_cleanly_within_its_timeout(hostile: HostileServer, mode: str) -> None:
    """Each probe returns (never raises) within its timeout; the attacked ones report a failure."""
    hostile.mode = mode
    async with aiohttp.ClientSession() as session:
        observations = await asyncio.gather(*(probe(session, hostile.url) for probe, _ in PROBES.values()))
        for (name, (_, requests)), obs in zip(PROBES.items(), observations, strict=True):
            assert obs.probe == name
            assert obs.latency_s is not None and obs.latency_s <= requests * TIMEOUT_S + SLACK_S, (name, obs)
            if name in ATTACKED[mode]:
                assert not obs.ok, (name, obs.detail)
                assert obs.values.get("verdict") != "fail", f"{name}: a lying server is no parser fault"


async def test_malformed_metrics_lines_are_skipped_and_the_rest_counted(hostile: HostileServer) -> None:
    """A malformed or undecodable line in /metrics costs that line only; the progress counters still read."""
    hostile.mode = "metrics_malformed"
    async with aiohttp.ClientSession() as session:
        samples, error, _ = await scrape_metrics(session, hostile.url, TIMEOUT_S, SETTINGS.metrics_max_bytes)
    assert error == "" and samples is not None
    assert {s.name for s in samples} == {"sglang:realtime_tokens_total", "sglang:num_running_reqs"}


async def test_hundreds_of_megabytes_are_never_buffered(hostile: HostileServer) -> None:
    """300 MB bodies on every endpoint: the probes allocate a bounded amount (reads are capped)."""
    hostile.mode = "huge_body"
    tracemalloc.start()
    try:
        async with aiohttp.ClientSession() as session:
            for probe, _ in PROBES.values():
                await probe(session, hostile.url)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # 8 concurrent streams x 1 MiB cap + one 4 MiB metrics body, with decoding copies: well under 64 MiB
    assert peak < 64 * 2**20, f"peak {peak / 2**20:.1f} MiB"


async def test_a_slow_but_correct_server_passes_every_probe(hostile: HostileServer) -> None:
    """Answers that take seconds but arrive within the timeouts are no failure (no false fault)."""
    hostile.mode = "slow_valid"
    settings = ProbeSettings(
        health_timeout_s=3 * TIMEOUT_S, canary_timeout_s=3 * TIMEOUT_S, expected_tool_parser="qwen25"
    )
    async with aiohttp.ClientSession() as session:
        results = await asyncio.gather(
            probe_health(session, hostile.url, settings.health_timeout_s),
            config_check(session, hostile.url, settings),
            tool_canary(session, hostile.url, "m", settings),
            stream_canary(session, hostile.url, "m", settings),
        )
        samples, error, _ = await scrape_metrics(session, hostile.url, settings.health_timeout_s, 2**20)
    assert all(o.ok for o in results), [o.detail for o in results if not o.ok]
    assert samples and not error
