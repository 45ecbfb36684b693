"""One Monitor per supervised server: the probe schedule and the window of what the probes saw. It observes;
deciding what the window means is `policies.triage`.

`tick(now)` never blocks for long: HTTP probes and py-spy run as tasks, at most one in flight per kind, and their
observations are collected on a later tick. Cheap local probes (logs, ranks, GPU) run inline at most once a
second. With the default settings the HTTP probes send about 0.3 requests/s on average (/health every 10 s,
/metrics every 5 s, two chat completions and /server_info every 5 min, `stream_canary_concurrency` streams
`stream_canary_first_s` after serving and then every 30 min).

Suspicion speeds the probes up: until the first 200 `/health` is probed every `STARTUP_HEALTH_PERIOD_S`; while
work is in flight `/metrics` is scraped every `BUSY_SCRAPE_S` (the time of the last counter move is known to
that precision), and every `SUSPECT_SCRAPE_S` once a scrape with work in flight saw no counter move; rank
stacks are dumped once at each of `STACKS_AT` (fractions of `stall_after_s`) of a stall episode, so the strong
evidence of `policies.diagnose` is there when its early threshold comes; a rank first seen frozen (stopped or in
uninterruptible sleep, no CPU time) has `/health` probed at once (after the one in flight, if any), so a frozen
idle engine is told by its first failed `/health` (SGLang answers 503 after its 20 s health timeout), not after
`unresponsive_after_s`.

While SGLang reports its engine paused by its client (probes/engine.py), `/health` (it would wait out the pause,
then mark SGLang unhealthy) and the canaries stand aside. A PD worker's canaries go through a pair
(probes/pd_pair.py), waiting while no partner is up; its live PD queues come from `/v1/loads` with every scrape.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
import time
from collections import deque
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

import aiohttp

from policies.diagnose import STRONG_STALL_FRACTION
from policies.leaks import INCONCLUSIVE, PASS
from policies.model import (
    Observation,
    ProbeSettings,
    TreeView,
    canary_values,
    dp_values,
    engine_values,
    gpu_values,
    progress_values,
    ranks_values,
    routine_reading,
)
from probes.canary import config_check, reasoning_canary, tool_canary
from probes.gpu_probe import GpuWatch
from probes.health import probe_health
from probes.logwatch import LogWatch
from probes.pd_pair import PdPair
from probes.requests import RequestLedger
from probes.scrape import Scraper
from probes.stacks import observe_ranks, probe_stacks
from probes.stream_canary import stream_canary

LOCAL_PERIOD_S, CANARY_RETRY_S, PAIR_RETRY_S = 1.0, 15.0, 2.0
STARTUP_HEALTH_PERIOD_S = 0.5
BUSY_SCRAPE_S, SUSPECT_SCRAPE_S = 2.0, 1.0
ROUTINE_KEEP_S = 60.0  # ≥ the spans policies.diagnose reads of local readings (a strong stall fraction)
RANK_SUSPECT_LAG_S = 2.0  # a DP rank's snapshot this far behind a peer's: longer than an idle loop's sleep
STACKS_AT = (STRONG_STALL_FRACTION * 0.8, 0.5)  # the first dump lands just before the early threshold
STAND_ASIDE = frozenset({"health", "canary_tool", "canary_stream"})  # while the engine is paused on purpose


class Monitor:
    """Owns the probes of one server and the window of what they saw."""

    def __init__(
        self,
        *,
        server: str,
        role: str,
        base_url: str,
        model: str,
        settings: ProbeSettings,
        tree: Callable[[], TreeView],
        gpu: Callable[[], list[dict[str, Any]]] | None,
        log_lines: Callable[[], list[str]],
        pids_for_stacks: Callable[[], dict[int, str]],
        pd_pair: Callable[[], PdPair | None] | None = None,
        xids_seen: set[tuple[int, int, float]] | None = None,
    ) -> None:
        self.server, self.role, self.model, self.settings = server, role, model, settings
        self.base_url = base_url.rstrip("/")
        self._pair = pd_pair  # a PD worker: the pair its canaries go through (None while no partner is up)
        self._tree, self._gpu_read, self._log_lines, self._pids = tree, gpu, log_lines, pids_for_stacks
        self._session: aiohttp.ClientSession | None = None
        self._tasks: dict[str, asyncio.Task[Observation]] = {}
        self.ready = asyncio.Event()  # set when a probe in flight finishes: the loop wakes to collect it
        self._window: deque[Observation] = deque(maxlen=20000)
        self._routine: deque[Observation] = deque(maxlen=20000)  # local readings that show nothing wrong
        self._cuts = (0.0, 0.0)  # what _prune dropped: older than these, in _window and in _routine
        self._latest: dict[str, Observation] = {}
        self._logs, self._gpu, self._scraper = LogWatch(), GpuWatch(), Scraper(role)
        self._requests = RequestLedger()
        if xids_seen is not None:  # an Xid an earlier launch of the server reported is not reported again
            self._gpu.seen = xids_seen
        self.reset(time.monotonic())

    def reset(self, now: float) -> None:
        """A new launch begins: clear the window, phase starting, every probe due now except the canaries."""
        for task in self._tasks.values():
            task.cancel()
        self._tasks = {}
        self._window.clear()
        self._routine.clear()
        self._latest = {}
        self.started_at = now
        self._due: dict[str, float] = {"health": now, "progress": now, "local": now, "logs_quiet": now}
        self._canary_history: deque[str] = deque(maxlen=3)
        self._canary_rank = 0  # a data-parallel server: the DP rank the next canary is routed to
        self._last_dp: Observation | None = None  # the DP ranks' snapshots of the newest scrape
        self._armed: set[str] = set()  # canaries scheduled at least once this launch
        self._healthy_seen = False  # /health answered 200 in this launch (probe it at its own period then)
        self._pending: list[Observation] = []  # recorded by a running task, returned by the next tick
        self._cpu: dict[str, float] = {}
        self._frozen: set[str] = set()  # ranks frozen in the newest reading
        self._health_for_frozen = False  # a freeze began: probe /health as soon as none is in flight
        self._stacks_done: set[tuple[float, float]] = set()  # (episode, fraction) dumped
        self._gpu_busy_at: float | None = None
        self._logs.reset(now)
        self._scraper.reset(now)
        self._requests.reset()

    async def tick(self, now: float) -> list[Observation]:
        """Collect finished probes, run the cheap local ones, start what is due; returns new observations."""
        self.ready.clear()
        new = self._collect(now)
        new += self._local(now)
        self._start_due(now)
        for obs in new:
            self._record(obs)
        self._prune(now)
        return new

    def window(self) -> list[Observation]:
        """What the probes saw in this launch (pruned by age; the newest of each probe always kept).

        Local readings that show nothing wrong (ranks all alive, GPUs without Xid, logs without a signature)
        are kept `ROUTINE_KEEP_S`; everything else as long as the longest window of the settings.
        """
        pruned = [o for o in self._latest.values() if o.at < self._cuts[1 if routine_reading(o) else 0]]
        return [*self._window, *self._routine, *pruned]

    def next_due(self) -> float:
        """When the next probe is due (monotonic): the loop may sleep until then unless `ready` is set first.

        A probe still in flight is not due (its end sets `ready`); the quiet-logs reading goes with the local ones.
        """
        pending = (t for kind, t in self._due.items() if kind not in self._tasks and kind != "logs_quiet")
        return min(pending, default=math.inf)

    def latest(self, probe: str) -> Observation | None:
        """The newest observation of one probe in this launch."""
        return self._latest.get(probe)

    def note_abort(self, now: float, rids: Sequence[str] = ()) -> None:
        """The supervisor aborted the requests `rids` now, or every request (the PD queue's stand restarts)."""
        if rids:
            self._requests.note_aborted(list(rids), now)
        else:
            self._scraper.progress.restart_pd(now)

    def reconfigure(self, settings: ProbeSettings) -> None:
        """New probe settings (a config reload) take effect from the next tick."""
        self.settings = settings

    async def aclose(self) -> None:
        """Cancel the probes in flight and close the HTTP session."""
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks = {}
        if self._session is not None:
            await self._session.close()
            self._session = None

    def snapshot(self) -> dict[str, Any]:
        """The last observation of each probe, JSON-ready (for /status)."""
        probes = {
            name: {
                "at": o.at,
                "ok": o.ok,
                "detail": o.detail,
                "latency_s": o.latency_s,
                "values": dict(o.values),
            }
            for name, o in sorted(self._latest.items())
        }
        return {"server": self.server, "role": self.role, "started_at": self.started_at, "in_flight": sorted(self._tasks), "probes": probes}  # fmt: skip

    # ---- internals

    def _record(self, obs: Observation) -> None:
        (self._routine if routine_reading(obs) else self._window).append(obs)
        self._latest[obs.probe] = obs

    def _prune(self, now: float) -> None:
        s = self.settings
        keep_s = max(s.unresponsive_after_s, s.startup_silence_s, 3 * s.stall_after_s) + 60.0
        self._cuts = (now - keep_s, now - ROUTINE_KEEP_S)
        for queue, cut in zip((self._window, self._routine), self._cuts, strict=True):
            while queue and queue[0].at < cut:
                queue.popleft()

    def _collect(self, now: float) -> list[Observation]:
        done, self._pending = self._pending, []
        for kind, task in list(self._tasks.items()):
            if not task.done():
                continue
            del self._tasks[kind]
            try:
                obs = task.result()
            except (asyncio.CancelledError, Exception) as exc:  # a probe never raises into the loop
                obs = Observation(kind, now, False, f"probe error: {type(exc).__name__}: {exc}"[:200])
            done.append(self._after(kind, obs, now))
        return done

    def _after(self, kind: str, obs: Observation, now: float) -> Observation:
        """Follow-ups of a finished probe: canary retries and the 2-of-3 soft verdict, the first canary."""
        s = self.settings
        if kind == "health" and obs.ok and not self._healthy_seen:  # the startup cadence ends here
            self._healthy_seen, self._due["health"] = True, now + s.health_period_s
        if kind == "health" and obs.ok and "canary_tool" not in self._armed and s.canaries_on:
            self._armed.add("canary_tool")
            self._due["canary_tool"] = now
        if kind == "canary_tool":
            verdict = str(canary_values(obs).get("verdict"))
            self._canary_history.append(verdict)
            retry = verdict == INCONCLUSIVE
            self._canary_rank = (self._canary_rank + 1) % max(1, s.dp_size)
            period = s.canary_period_s / max(1, s.dp_size)  # every DP rank proven once a canary period
            self._due["canary_tool"] = now + (min(period, CANARY_RETRY_S) if retry else period)
            soft = retry and sum(v == INCONCLUSIVE for v in self._canary_history) >= 2
            obs = dataclasses.replace(obs, values={**obs.values, "soft_fail": soft})
            if verdict == PASS and "canary_stream" not in self._armed and s.stream_canary_on:
                self._armed.add("canary_stream")
                self._due["canary_stream"] = now + min(s.stream_canary_period_s, s.stream_canary_first_s)
        if kind == "canary_stream" and s.stream_canary_on:
            self._due["canary_stream"] = now + s.stream_canary_period_s
        if kind == "progress" and (progress_values(obs).get("work") or self._rank_lags()):
            moved = progress_values(obs).get("moved") and not self._rank_lags()
            period = BUSY_SCRAPE_S if moved else SUSPECT_SCRAPE_S
            self._due["progress"] = min(self._due.get("progress", now), now + period)
        return obs

    def _rank_lags(self) -> bool:
        """A DP rank's snapshot lags its peers' by more than an idle loop's second (scrape faster meanwhile)."""
        dp = self._last_dp
        ranks = dp_values(dp).get("ranks", {}) if dp else {}
        return any(float(v.get("lag_s", 0.0)) >= RANK_SUSPECT_LAG_S for v in ranks.values())

    def _local(self, now: float) -> list[Observation]:
        if now < self._due["local"]:
            return []
        self._due["local"] = now + LOCAL_PERIOD_S
        out: list[Observation] = []
        lines = self._safe(self._log_lines, [])
        if lines or now >= self._due["logs_quiet"]:
            self._due["logs_quiet"] = now + self.settings.metrics_period_s
            out.append(self._logs.observe(lines, now))
        out += [r for r in [self._requests.observe(lines, now)] if r is not None]  # SGLang's request log
        tree = self._safe(self._tree, None)
        if tree is not None:
            ranks = observe_ranks(tree, self._cpu, now)
            self._cpu = dict(ranks_values(ranks).get("cpu_s", {}))
            frozen = set(ranks_values(ranks).get("frozen", ()))
            if frozen - self._frozen and self._healthy_seen:
                self._health_for_frozen = True
            self._frozen = frozen
            out.append(ranks)
        if self._gpu_read is not None:
            gpu = self._gpu.observe(self._gpu_read, now)
            if gpu_values(gpu).get("busy"):
                self._gpu_busy_at = now
            out.append(gpu)
        return out

    @staticmethod
    def _safe(fn: Callable[[], Any], default: Any) -> Any:
        try:
            return fn()
        except Exception:  # the launcher's callbacks must not break the loop
            return default

    def _start_due(self, now: float) -> None:
        s = self.settings
        # Until the first 200 the port is closed or warming up: refusals and 503s are cheap, probe more often.
        first = not self._healthy_seen
        if self._health_for_frozen and "health" not in self._tasks:
            self._health_for_frozen = False
            self._due["health"] = now
        self._launch(
            "health",
            now,
            min(s.health_period_s, STARTUP_HEALTH_PERIOD_S) if first else s.health_period_s,
            lambda session: probe_health(session, self.base_url, s.health_timeout_s),
        )
        self._launch("progress", now, s.metrics_period_s, self._scrape)
        if self._launch("canary_tool", now, None, self._canaries):
            self._due.pop("canary_tool", None)
        if self._launch("canary_stream", now, None, self._stream):
            self._due.pop("canary_stream", None)
        progress = self._latest.get("progress")
        stalled = float(progress_values(progress).get("stalled_s", 0.0)) if progress else 0.0
        episode = self._scraper.progress.work_since
        if episode is None or "stacks" in self._tasks:
            return
        due = [
            f for f in STACKS_AT if stalled >= s.stall_after_s * f and (episode, f) not in self._stacks_done
        ]
        if due:
            self._stacks_done.update((episode, f) for f in due)
            pids = self._safe(self._pids, {})
            self._tasks["stacks"] = self._track(asyncio.ensure_future(probe_stacks(pids, s.stacks_budget_s)))

    def _launch(
        self,
        kind: str,
        now: float,
        period: float | None,
        make: Callable[[aiohttp.ClientSession], Coroutine[Any, Any, Observation]],
    ) -> bool:
        due = self._due.get(kind)
        if due is None or now < due or kind in self._tasks:
            return False
        if kind in STAND_ASIDE and self.engine_paused():
            return False
        if kind in ("canary_tool", "canary_stream") and self._pair and self._safe(self._pair, None) is None:
            self._due[kind] = now + PAIR_RETRY_S  # a PD worker's canary waits for a partner with /health 200
            return False
        if period is not None:
            self._due[kind] = now + period
        self._tasks[kind] = self._track(asyncio.ensure_future(make(self._http())))
        return True

    def engine_paused(self) -> bool:
        """SGLang reported its engine paused by its client in the newest scrape."""
        engine = self._latest.get("engine")
        return engine is not None and bool(engine_values(engine).get("paused"))

    def _track(self, task: asyncio.Task[Observation]) -> asyncio.Task[Observation]:
        task.add_done_callback(lambda _: self.ready.set())
        return task

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=max(32, self.settings.stream_canary_concurrency * 2)),
                timeout=aiohttp.ClientTimeout(
                    total=max(self.settings.health_timeout_s, self.settings.canary_timeout_s)
                ),
            )
        return self._session

    async def _scrape(self, session: aiohttp.ClientSession) -> Observation:
        """/metrics into the lease, with what SGLang says beside it (probes/scrape.py)."""
        others = [t for t in (self._logs.last_progress_at, self._gpu_busy_at) if t is not None]
        # a prefill's canary is judged on its decode (the prefill's half is in its HTTP gauge while it runs)
        canary = self.role != "prefill" and any(k in self._tasks for k in ("canary_tool", "canary_stream"))
        progress, side = await self._scraper.run(
            session,
            self.base_url,
            self.settings,
            canary_outstanding=canary,
            other_progress_at=max(others) if others else None,
        )
        self._pending.extend(side)  # looked up after the await: tick() swaps the list
        self._last_dp = next((o for o in side if o.probe == "dp"), None)
        return progress

    async def _canaries(self, session: aiohttp.ClientSession) -> Observation:
        """Config check and reasoning canary first (recorded here), then the tool canary (returned)."""
        s = self.settings
        if s.expected_tool_parser or s.expected_reasoning_parser:
            checked = await config_check(session, self.base_url, s)
            self._pending.append(checked)  # looked up after the await: tick() swaps the list
        url, pair = self._target()
        rank = self._canary_rank if s.dp_size > 1 and pair is None else None
        if s.expected_reasoning_parser:
            reasoned = await reasoning_canary(session, url, self.model, s, pair, dp_rank=rank)
            self._pending.append(reasoned)
        return await tool_canary(session, url, self.model, s, pair=pair, dp_rank=rank)

    async def _stream(self, session: aiohttp.ClientSession) -> Observation:
        (url, pair), tool = self._target(), self._latest.get("canary_tool")
        return await stream_canary(session, url, self.model, self.settings, tool.ok if tool else None, pair)

    def _target(self) -> tuple[str, PdPair | None]:
        """Where the canaries go: this server, or a PD worker's pair (through its decode)."""
        pair = self._safe(self._pair, None) if self._pair else None
        return (pair.decode_url if pair else self.base_url), pair
