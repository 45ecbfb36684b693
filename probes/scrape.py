"""One scrape of a server: `/metrics` folded into the progress lease and the load trend (probes/load.py), and
beside it what SGLang says on other endpoints — its engine paused by its client (`/ready`, `/ping`: probes/engine.py) and each DP rank's snapshot
(`/v1/loads`, read for a PD worker, whose live queues it holds, and for a data-parallel server: probes/loads.py).

A router has no engine: only its `/metrics` is read.
"""

from __future__ import annotations

import asyncio
import time

import aiohttp

from policies.model import Observation, ProbeSettings, engine_values
from probes.engine import EngineTracker, ready_and_ping
from probes.load import LoadTrend
from probes.loads import PdLoads, RankLoad, dp_observation, pd_summary, read_loads
from probes.progress import ProgressTracker, Sample, scrape_metrics

SIDE_READ_S = 5.0  # /ready, /ping, /v1/loads beside a scrape (a real /ready hung 62 s on a stopped scheduler)
PD_ROLES = frozenset({"prefill", "decode"})


class Scraper:
    """The state across scrapes of one server: its progress lease and its engine's pause."""

    def __init__(self, role: str) -> None:
        self.role = role
        self.progress = ProgressTracker(role)
        self.engine = EngineTracker()
        self.load = LoadTrend()

    def reset(self, now: float) -> None:
        """A new launch: the lease counts from `now`, no pause known, no load baseline."""
        self.progress.reset(now)
        self.engine.reset()
        self.load.reset()

    async def run(
        self,
        session: aiohttp.ClientSession,
        base_url: str,
        s: ProbeSettings,
        *,
        canary_outstanding: bool,
        other_progress_at: float | None,
    ) -> tuple[Observation, list[Observation]]:
        """(the progress observation, the observations read beside it: `engine`, and `dp` when read)."""
        scrape = scrape_metrics(session, base_url, s.health_timeout_s, s.metrics_max_bytes, s.api_key)
        if self.role == "router":
            samples, error, latency = await scrape
            return self._fold(samples, error, latency, canary_outstanding, other_progress_at), []
        side_s = min(s.health_timeout_s, SIDE_READ_S)
        start = time.monotonic()
        (samples, error, latency), (ready, ping), ranks = await asyncio.gather(
            scrape,
            ready_and_ping(session, base_url, side_s, s.api_key),
            self._loads(session, base_url, s, side_s),
        )
        now = time.monotonic()
        engine = self.engine.update(samples, ready, ping, now, now - start)
        side = [engine, *[o for o in [self.load.update(samples, now, s.brownout_after_s)] if o is not None]]
        if s.dp_size > 1:
            side.append(dp_observation(ranks, now, now - start))
        paused = bool(engine_values(engine).get("paused"))
        progress = self._fold(
            samples,
            error,
            latency,
            canary_outstanding,
            other_progress_at,
            paused,
            pd_summary(ranks, self.role),
        )
        return progress, side

    async def _loads(
        self, session: aiohttp.ClientSession, base_url: str, s: ProbeSettings, timeout_s: float
    ) -> list[RankLoad] | None:
        if self.role not in PD_ROLES and s.dp_size <= 1:
            return None
        return await read_loads(session, base_url, timeout_s, s.api_key)

    def _fold(
        self,
        samples: list[Sample] | None,
        error: str,
        latency: float,
        canary_outstanding: bool,
        other_progress_at: float | None,
        paused: bool = False,
        pd_live: PdLoads | None = None,
    ) -> Observation:
        return self.progress.update(
            samples,
            time.monotonic(),
            canary_outstanding=canary_outstanding,
            other_progress_at=other_progress_at,
            error=error,
            latency_s=latency,
            paused=paused,
            pd_live=pd_live,
        )
