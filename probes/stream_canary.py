"""The concurrent streaming canary: N parallel streams, each asking about a different city.

Leaks that appear only under load come from coalesced stream chunks (parsers.md §5, failure-modes.md F16).
Each stream must call the tool with its own city only; a hard signature or a structural failure in any stream
fails the round. The monitor compares the result with the single-stream canary: a failure here while the single
canary passes is a `stream_leak` (alert, degrade, never restart).
"""

from __future__ import annotations

import asyncio
import time

import aiohttp

from policies.leaks import FAIL, INCONCLUSIVE, PASS, judge_tool
from policies.model import CanaryValues, Observation, ProbeSettings
from probes.canary import TOOL_NAME, chat, tool_body
from probes.pd_pair import PdPair

CITIES = (
    "Paris", "Oslo", "Lima", "Kyiv", "Quito", "Accra", "Hanoi", "Dakar",
    "Tunis", "Sofia", "Riga", "Bern", "Doha", "Male", "Apia", "Suva",
    "Minsk", "Baku", "Rome", "Cairo", "Dhaka", "Delhi", "Tokyo", "Seoul",
    "Lagos", "Nairobi", "Havana", "Manila", "Madrid", "Lisbon", "Vienna", "Prague",
)  # fmt: skip


async def stream_canary(
    session: aiohttp.ClientSession,
    base_url: str,
    model: str,
    settings: ProbeSettings,
    single_ok: bool | None = None,
    pair: PdPair | None = None,
) -> Observation:
    """Fire `stream_canary_concurrency` streams at once and judge each (probe `canary_stream`)."""
    start = time.monotonic()
    n = max(1, settings.stream_canary_concurrency)
    cities = [CITIES[i % len(CITIES)] for i in range(n)]
    url = f"{base_url}/v1/chat/completions"
    results = await asyncio.gather(
        *(
            chat(
                session,
                url,
                tool_body(model, city, settings.canary_max_tokens, True),
                settings.canary_timeout_s,
                api_key=settings.api_key,
                pair=pair,
            )
            for city in cities
        )
    )
    verdicts = [judge_tool(r, TOOL_NAME, c) for r, c in zip(results, cities, strict=True)]
    failed = [(c, v) for c, v in zip(cities, verdicts, strict=True) if v.verdict == FAIL]
    passed = sum(v.verdict == PASS for v in verdicts)
    leaks = sorted({m for _, v in failed for m in v.leaks})
    if failed:
        verdict = FAIL
        reason = f"{len(failed)}/{n} concurrent streams failed: {failed[0][0]}: {failed[0][1].reason}"
    elif passed == n:
        verdict, reason = PASS, f"{n}/{n} concurrent streams clean"
    else:
        verdict, reason = INCONCLUSIVE, f"{passed}/{n} streams passed, none failed"
    end = time.monotonic()
    values: CanaryValues = {
        "verdict": verdict,
        "reason": reason,
        "concurrency": n,
        "passed": passed,
        "failed": {c: v.reason for c, v in failed[:8]},
        "leaks": leaks,
        "single_ok": single_ok,
        "fail_rate": round(len(failed) / n, 3),
    }
    return Observation("canary_stream", end, verdict == PASS, f"{verdict}: {reason}", end - start, values)
