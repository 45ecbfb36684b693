"""A PD worker's own signals and its canary through the pair (real-pd.md, contracts "PD pair").

A prefill or decode of SGLang refuses a request without a bootstrap room (400 `Disaggregated request received
without bootstrap room id`), so a PD worker is proven the way SGLang's router serves it: the same request sent to
a prefill and a decode at once, carrying `bootstrap_host`/`bootstrap_port` (the prefill's) and a fresh
`bootstrap_room`. The decode's answer is the one judged; the prefill's half must answer 200 too. No router is
needed, and the canary proves this very pair.

The decode's PD queue gauges on `/metrics` are written only with a batch's stats: a request parked waiting for
its KV with nothing running leaves them at 0 (real-pd.md §4a). `GET /v1/loads` is published by the scheduler's
loop, so its `disaggregation` queues are live: the monitor reads them beside `/metrics` (probes/loads.py).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import aiohttp

from probes.base import auth_headers, error_message, read_capped
from probes.loads import LOADS_MAX_BYTES


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
