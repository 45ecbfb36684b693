"""`GET /v1/loads`: each DP rank's own load snapshot (contracts "Data parallelism", "PD pair").

Every scheduler (one per DP rank) publishes a snapshot of its queues with the wall-clock `timestamp` of its writing,
every loop iteration: after each batch, every 50 ms while work waits, and at least once a second while idle (even
with `--sleep-on-idle`). The HTTP server reads the snapshots, so `/v1/loads` answers while a rank is stopped or
stuck, and that rank's `timestamp` stops where its loop stopped. A rank's *lag* — how much older its snapshot is
than the newest of its peers' — is therefore how long its loop has not turned while theirs did: both clocks are
the host's, and no scrape interval enters the figure. The probe reports it; `policies.dp` judges it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from policies.model import DpValues, Observation
from probes.base import auth_headers, read_capped

LOADS_MAX_BYTES = 256 * 1024
PD_LOAD_QUEUES = {
    "decode": ("decode_prealloc_queue_reqs", "decode_transfer_queue_reqs"),
    "prefill": ("prefill_bootstrap_queue_reqs", "prefill_inflight_queue_reqs"),
}
# the queue whose requests wait for the partner's step: a decode's KV to arrive, a prefill's decode to pre-allocate
PARTNER_QUEUE = {"decode": "decode_transfer_queue_reqs", "prefill": "prefill_bootstrap_queue_reqs"}


@dataclass(frozen=True)
class RankLoad:
    """One DP rank's snapshot."""

    dp_rank: int
    timestamp: float
    running: float
    waiting: float
    disaggregation: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class PdLoads:
    """The live queues of a PD worker from `/v1/loads`, summed over its DP ranks."""

    queue: float  # decode: prealloc + transfer; prefill: bootstrap + inflight
    running: float
    waiting: float = 0.0  # of `queue`, waiting for the partner (`PARTNER_QUEUE`)


def parse_loads(raw: bytes) -> list[RankLoad] | None:
    """The ranks of a `/v1/loads` body (None when it is not one)."""
    try:
        out = []
        for rank in json.loads(raw)["loads"]:
            pd = rank.get("disaggregation") or {}
            out.append(
                RankLoad(
                    int(rank.get("dp_rank") or 0),
                    float(rank.get("timestamp") or 0.0),
                    float(rank.get("num_running_reqs") or 0),
                    float(rank.get("num_waiting_reqs") or 0),
                    {k: float(v) for k, v in pd.items() if isinstance(v, int | float)},
                )
            )
    except (ValueError, TypeError, AttributeError, KeyError, RecursionError):
        return None
    return out


async def read_loads(
    session: aiohttp.ClientSession, base_url: str, timeout_s: float, api_key: str | None
) -> list[RankLoad] | None:
    """`GET /v1/loads`, bounded: each DP rank's snapshot (None when not readable)."""
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
    return None if len(raw) > LOADS_MAX_BYTES else parse_loads(raw)


def pd_summary(ranks: list[RankLoad] | None, role: str) -> PdLoads | None:
    """A PD worker's live queues over its ranks (None for other roles, or without a reading)."""
    names = PD_LOAD_QUEUES.get(role)
    if names is None or ranks is None:
        return None
    queue = sum(r.disaggregation.get(n, 0.0) for r in ranks for n in names)
    waiting = sum(r.disaggregation.get(PARTNER_QUEUE[role], 0.0) for r in ranks)
    return PdLoads(queue, sum(r.running for r in ranks), waiting)


def dp_observation(ranks: list[RankLoad] | None, now: float, latency_s: float | None = None) -> Observation:
    """`dp`: each DP rank's snapshot age against the newest of them (its lag), with its running and waiting
    requests as of that snapshot; a rank that has not published yet (timestamp 0) has no lag."""
    if ranks is None:
        return Observation("dp", now, False, "/v1/loads unreadable", latency_s, {})
    newest = max((r.timestamp for r in ranks if r.timestamp > 0), default=0.0)
    values: dict[str, Any] = {
        str(r.dp_rank): {
            "lag_s": round(newest - r.timestamp, 3) if r.timestamp > 0 else 0.0,
            "running": r.running,
            "waiting": r.waiting,
            "timestamp": r.timestamp,
        }
        for r in ranks
    }
    lagging = {k: v["lag_s"] for k, v in values.items() if v["lag_s"] > 0}
    worst = max(lagging.items(), key=lambda kv: kv[1], default=None)
    detail = f"{len(ranks)} DP ranks" + (f"; DP{worst[0]} {worst[1]:.1f}s behind" if worst else "")
    dp: DpValues = {"ranks": values}
    return Observation("dp", now, True, detail, latency_s, dict(dp))
