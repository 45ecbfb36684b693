"""A PD worker's own signals and its canary through the pair (real-pd.md, contracts "PD pair").

A prefill or decode of SGLang refuses a request without a bootstrap room (400 `Disaggregated request received
without bootstrap room id`), so a PD worker is proven the way SGLang's router serves it: the same request sent to
a prefill and a decode at once, carrying `bootstrap_host`/`bootstrap_port` (the prefill's) and a fresh
`bootstrap_room`. The decode's answer is the one judged; the prefill's half must answer 200 too. No router is
needed, and the canary proves this very pair.

The decode's PD queue gauges on `/metrics` are written only with a batch's stats: a request parked waiting for
its KV with nothing running leaves them at 0 (real-pd.md §4a). `GET /v1/loads` is published by the scheduler's
loop, so its `disaggregation` queues are live: the probe reads them beside `/metrics`.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Any

import aiohttp

from probes.base import auth_headers, error_message, read_capped

LOADS_MAX_BYTES = 256 * 1024
PD_LOAD_QUEUES = {
    "decode": ("decode_prealloc_queue_reqs", "decode_transfer_queue_reqs"),
    "prefill": ("prefill_bootstrap_queue_reqs", "prefill_inflight_queue_reqs"),
}
# the queue whose requests wait for the partner's step: a decode's KV to arrive, a prefill's decode to pre-allocate
PARTNER_QUEUE = {"decode": "decode_transfer_queue_reqs", "prefill": "prefill_bootstrap_queue_reqs"}


@dataclass(frozen=True)
class PdPair:
    """Where a canary goes through the pair: the prefill's HTTP URL and bootstrap endpoint, the decode's URL."""

    prefill_url: str
    decode_url: str
    bootstrap_host: str
    bootstrap_port: int

    def fields(self) -> dict[str, Any]:
        """What SGLang's router adds to a request: the prefill's bootstrap endpoint and a fresh room."""
        return {
            "bootstrap_host": self.bootstrap_host,
            "bootstrap_port": self.bootstrap_port,
            "bootstrap_room": random.getrandbits(63),
        }


@dataclass(frozen=True)
class PdLoads:
    """The live queues of a PD worker from `/v1/loads`, summed over its DP ranks."""

    queue: float  # decode: prealloc + transfer; prefill: bootstrap + inflight
    running: float
    waiting: float = 0.0  # of `queue`, waiting for the partner (`PARTNER_QUEUE`)


async def prefill_half(
    session: aiohttp.ClientSession, url: str, body: dict[str, Any], timeout_s: float, api_key: str | None
) -> str:
    """POST the prefill's half of a PD request and read it to the end (capped): '' on 200, else why not."""
    try:
        async with session.post(
            url, json=body, headers=auth_headers(api_key), timeout=aiohttp.ClientTimeout(total=timeout_s)
        ) as resp:
            raw = await read_capped(resp, LOADS_MAX_BYTES)
            if resp.status == 200:
                return ""
            said = error_message(raw)
            return f"prefill answered HTTP {resp.status}" + (f": {said}" if said else "")
    except TimeoutError:
        return f"prefill gave no answer within {timeout_s:g}s"
    except (aiohttp.ClientError, OSError) as exc:
        return f"prefill: {type(exc).__name__}"[:200]


async def pd_loads(
    session: aiohttp.ClientSession, base_url: str, role: str, timeout_s: float, api_key: str | None
) -> PdLoads | None:
    """`GET /v1/loads` of a PD worker: its live PD queue and running requests (None when not readable)."""
    names = PD_LOAD_QUEUES.get(role)
    if names is None:
        return None
    try:
        async with session.get(
            f"{base_url}/v1/loads",
            headers=auth_headers(api_key),
            timeout=aiohttp.ClientTimeout(total=timeout_s),
        ) as resp:
            if resp.status != 200:
                return None
            raw = await read_capped(resp, LOADS_MAX_BYTES + 1)
    except (aiohttp.ClientError, OSError, TimeoutError):
        return None
    if len(raw) > LOADS_MAX_BYTES:
        return None
    try:
        loads = json.loads(raw).get("loads")
        queue = running = waiting = 0.0
        for rank in loads:
            pd = rank.get("disaggregation") or {}
            queue += sum(float(pd.get(n) or 0) for n in names)
            waiting += float(pd.get(PARTNER_QUEUE[role]) or 0)
            running += float(rank.get("num_running_reqs") or 0)
    except (ValueError, TypeError, AttributeError, RecursionError):
        return None
    return PdLoads(queue, running, waiting)
