"""Data parallelism as SGLang 0.5.23 runs it (`--dp-size N`): one scheduler loop per DP rank behind one tokenizer.

Each DP rank is an `Engine` of its own (its TP group, its batch, its `/v1/loads` snapshot, its scheduler metrics
labelled `dp_rank`). The DP controller routes each request round-robin, or to `routed_dp_rank` when a request
names one; `/health` takes a round-robin of its own. The tokenizer's heartbeat (`last_receive_tstamp`) is any
rank's output, so a `/health` sent to a stopped rank still answers 200 when another rank produced a token during
its wait, and 503 after the health timeout otherwise (contracts "Data parallelism").

With `--enable-dp-attention` the ranks share the MoE layers' collectives: a rank stuck there holds every rank.
"""

from __future__ import annotations

import itertools
import threading

from simulator.engine import Engine
from simulator.request import Req


class RouteError(ValueError):
    """A `routed_dp_rank` the server has no rank for (SGLang: 400 with this message)."""


class DpEngines:
    """The engines of a server's DP ranks, seen by the HTTP side as one scheduler."""

    def __init__(self, engines: list[Engine]) -> None:
        self.engines = engines
        self._next = itertools.count()
        self._next_health = itertools.count()
        self._lock = threading.Lock()

    @property
    def first(self) -> Engine:
        """DP rank 0 (a PD worker's queues live there: the simulator runs PD at `--dp-size 1` only)."""
        return self.engines[0]

    def route(self, routed_dp_rank: int | None = None) -> Engine:
        """The engine a request goes to: the one it names, else the next in turn."""
        n = len(self.engines)
        if routed_dp_rank is not None and not (n <= 1 and routed_dp_rank == 0):
            if not 0 <= routed_dp_rank < n:
                raise RouteError(f"routed_dp_rank={routed_dp_rank} out of range [0, {n})")
            return self.engines[routed_dp_rank]
        with self._lock:
            return self.engines[next(self._next) % n]

    def submit(self, req: Req, routed_dp_rank: int | None = None) -> None:
        """Queue a request on its rank."""
        self.route(routed_dp_rank).submit(req)

    def submit_health(self) -> None:
        """A health generation, to the next rank in the health round-robin."""
        with self._lock:
            engine = self.engines[next(self._next_health) % len(self.engines)]
        engine.submit_health()

    def start(self) -> None:
        """Start every rank's engine."""
        for engine in self.engines:
            engine.start()

    def stop(self) -> None:
        """Stop every rank's engine after its current step."""
        for engine in self.engines:
            engine.stop()

    def pause(self, mode: str) -> None:
        """`/pause_generation` pauses every rank."""
        for engine in self.engines:
            engine.pause(mode)

    def resume(self) -> None:
        """`/continue_generation` resumes every rank."""
        for engine in self.engines:
            engine.resume()

    def abort_all(self) -> None:
        """`/abort_request {"abort_all": true}` reaches every rank."""
        for engine in self.engines:
            engine.abort_all()

    def abort(self, rid: str) -> None:
        """`/abort_request {"rid": …}`: the rank holding that request ends it."""
        for engine in self.engines:
            if engine.abort(rid):
                return

    @property
    def last_receive_tstamp(self) -> float:
        """The tokenizer's heartbeat: the newest output of any rank."""
        return max(e.last_receive_tstamp for e in self.engines)

    @property
    def stalled(self) -> bool:
        """A fan-out to every rank (`/server_info`'s internal state) waits for a stalled one."""
        return any(e.stalled for e in self.engines)

    @property
    def load(self) -> int:
        """Requests in every rank's batch or waiting for it."""
        return sum(e.load for e in self.engines)

    @property
    def wedged(self) -> str:
        """The fault that wedged a rank ('' when none)."""
        return next((e.wedged for e in self.engines if e.wedged), "")
