"""The main process's scheduler side: admits requests, drives the ranks step by step, emits tokens.

One engine thread owns the ranks' pipes. Each step is sent to every rank; rank 0 of each TP group answers when
the step's collectives complete. A wedged group never answers, so the thread blocks exactly where SGLang's
TokenizerManager would wait, gauges freeze, and only a health "busy path" (when the fault has one) stays green.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection

from simulator.faults import FaultBook
from simulator.logs import log, rank_prefix
from simulator.modes import choose_mode
from simulator.request import Req
from simulator.sim_metrics import SimMetrics
from simulator.watchdog import watchdog_loop

IDLE_PUBLISH_S = 0.2  # an idle scheduler loop publishes its load snapshot this often (SGLang: each loop)


class Engine:
    """Drives the rank processes and turns steps into tokens."""

    def __init__(
        self,
        conns: list[Connection],
        leaders: list[Connection],
        faults: FaultBook,
        metrics: SimMetrics,
        *,
        tp_size: int,
        step_s: float,
        overlap: bool,
        speculative: bool,
        watchdog_timeout: float,
        watchdog_label: str,
        decode_log_interval: int,
        rank_pids: list[int],
        cross_node: Callable[[dict[str, object]], None] | None = None,
        dp_rank: int | None = None,
        dp_size: int = 1,
        dp_attention: bool = False,
    ) -> None:
        self.conns = conns
        self.leaders = leaders
        self.faults = faults
        self.metrics = metrics
        self.tp_size = tp_size
        self.step_s = step_s
        self.overlap = overlap
        self.speculative = speculative
        self.watchdog_timeout = watchdog_timeout
        self.watchdog_label = (
            watchdog_label  # "300" by default, "4.0" when the flag was given, as SGLang prints
        )
        self.rank_pids = rank_pids
        self.cross_node = cross_node  # the collective with the other nodes of a multi-node group
        self.dp_rank = dp_rank  # None: not data-parallel
        self.dp_size = dp_size
        self.dp_attention = dp_attention  # the DP ranks share the MoE collectives: one stuck rank holds all
        self.prefix = rank_prefix(dp_rank, 0, tp_size) if tp_size > 1 or dp_rank is not None else ""
        self.decode_log_interval = max(1, decode_log_interval)
        self.cond = threading.Condition()
        self.waiting: list[Req] = []
        self.running: list[Req] = []
        self.parked = 0  # requests held outside the batch (PD transfer queue, post-restart hang)
        self.stopping = False
        self.last_receive_tstamp = 0.0
        self.snapshot_at = time.time()  # the /v1/loads timestamp: refreshed by a live scheduler loop only
        self.dead = False  # a rank's pipe broke: the scheduler side never answers again
        self.forward_ct = 0
        self.batch_active_since: float | None = None
        self.step_due: float | None = None  # when the step in progress should have answered
        self.wedged: str = ""  # the fault that wedged the ranks
        self.health_busy_path = False
        self.long_prefill_until = 0.0
        self.paused = ""  # SGLang's /pause_generation mode while paused: abort | retract | in_place
        self.capacity: int | None = None  # brownout: the batch size it is pinned at (None: admit everything)
        self._told = False  # the ranks were told the scheduler is paused (retract, in_place)
        self._steps = itertools.count(1)
        self._thread = threading.Thread(target=self._loop, name="scheduler-client", daemon=True)
        self._watchdog = threading.Thread(
            target=watchdog_loop, args=(self,), name="scheduler-watchdog", daemon=True
        )

    def start(self) -> None:
        """Start the engine and the simulated scheduler watchdog."""
        self._thread.start()
        self._watchdog.start()

    def stop(self) -> None:
        """Ask the engine thread to stop after the current step."""
        with self.cond:
            self.stopping = True
            self.cond.notify_all()

    def submit(self, req: Req) -> None:
        """Queue a request for the next step."""
        with self.cond:
            self.waiting.append(req)
            self.cond.notify_all()

    def submit_health(self) -> None:
        """A health generation: executed only when idle; a busy scheduler answers after its next batch."""
        with self.cond:
            if not self.running and not self.waiting:
                self.waiting.append(
                    Req(f"HEALTH_CHECK_{time.time_ns()}", ["."], 1, "length", _drop, kind="health")
                )
                self.cond.notify_all()

    def pause(self, mode: str) -> None:
        """`/pause_generation`: `abort` ends every user request (the scheduler is not told); `retract` moves the
        running requests back to the queue and publishes idle stats once; `in_place` keeps them as they are (the
        gauges stay stale, and SGLang's watchdog still sees the batch). Nothing steps until `resume`."""
        with self.cond:
            self.paused = mode
            if mode == "abort":
                self._abort_users()
            elif mode == "retract":
                self.waiting = [*self.running, *self.waiting]
                self.running = []
                queued = len([r for r in self.waiting if r.kind == "user"])
                self.metrics.log_stats(0, queued, self.parked, throughput=0.0)
            elif self.running:  # in_place: the batch stays current, so the watchdog's clock runs
                self.batch_active_since = time.monotonic()
            self.cond.notify_all()

    def batch_size(self) -> int:
        """User requests in the running batch (read without the lock: a wedged step may hold it)."""
        return sum(1 for r in list(self.running) if r.kind == "user")

    def abort_all(self) -> None:
        """`/abort_request {"abort_all": true}`: every user request ends with an abort."""
        with self.cond:
            self._abort_users()
            self.cond.notify_all()

    def abort(self, rid: str) -> bool:
        """`/abort_request {"rid": …}`: that request ends with an abort (an `unabortable` stuck one does not)."""
        with self.cond:
            found = [r for r in (*self.running, *self.waiting) if r.rid == rid and r.stuck != "unabortable"]
            self.running = [r for r in self.running if r not in found]
            self.waiting = [r for r in self.waiting if r not in found]
            self.cond.notify_all()
        for req in found:
            req.sink([], True, "abort")
        return bool(found)

    def _abort_users(self) -> None:
        dropped = [r for r in (*self.running, *self.waiting) if r.kind == "user"]
        self.running = [r for r in self.running if r.kind != "user"]
        self.waiting = [r for r in self.waiting if r.kind != "user"]
        for req in dropped:
            req.sink([], True, "abort")
        self.metrics.log_stats(0, 0, self.parked, throughput=0.0)

    def resume(self) -> None:
        """`/continue_generation`: the scheduler steps again (retracted requests are recomputed)."""
        with self.cond:
            self.paused = ""
            self.batch_active_since = None
            self.cond.notify_all()

    def step_overdue(self, now: float, grace_s: float = 2.0) -> bool:
        """A step has waited `grace_s` past its time for its ranks (one stopped, or stuck in a collective)."""
        due = self.step_due
        return due is not None and now > due + grace_s

    def _scheduler_paused(self) -> bool:
        return self.paused in ("retract", "in_place")

    @property
    def desynced(self) -> bool:
        """True when the TP ranks are stuck in different collectives (the last rank ahead, idle on its GPU)."""
        return self.wedged in ("overlap_tp_desync_hang", "watchdog_disabled_silent_wedge")

    @property
    def stalled(self) -> bool:
        """True when scheduler round-trips never complete (wedged ranks or a dead rank)."""
        return bool(self.wedged) or self.dead

    @property
    def load(self) -> int:
        """Requests in the batch or waiting for it."""
        with self.cond:
            return len(self.running) + len([r for r in self.waiting if r.kind == "user"])

    def _loop(self) -> None:
        last_idle_log = time.monotonic()
        while True:
            with self.cond:
                while not self.stopping and (self.dead or self._nothing_to_do()):
                    self.cond.wait(timeout=IDLE_PUBLISH_S)
                    if not self.dead and not self.paused:
                        self.snapshot_at = time.time()
                    if time.monotonic() - last_idle_log >= 30.0 and not self.paused:
                        last_idle_log = time.monotonic()
                        self.metrics.idle_tick()
                if self.stopping:
                    return
                tell = self._scheduler_paused()
                if tell == self._told:
                    new = self._admit()
                    running = list(self.running)
            if tell != self._told:  # the ranks' paused loop begins or ends (told from this thread only)
                self._told = tell
                self._send_all({"op": "pause" if tell else "continue"})
                continue
            self._step(new, running)

    def _admit(self) -> list[Req]:
        """Under the lock: move the waiting requests into the batch — all, or in a brownout only as many as keep
        the batch at its size when the brownout began (the running count pinned, the queue growing)."""
        room = len(self.waiting) if self.capacity is None else max(0, self.capacity - len(self.running))
        new, self.waiting = self.waiting[:room], self.waiting[room:]
        self.running.extend(new)
        return new

    def _nothing_to_do(self) -> bool:
        """Under the lock: no step to run and nothing to tell the ranks."""
        if self._told != self._scheduler_paused():
            return False
        return bool(self.paused) or (not self.waiting and not self.running)

    def _send_all(self, message: dict[str, object]) -> None:
        try:
            for conn in self.conns:
                conn.send(message)
        except (OSError, ValueError):
            self.dead = True

    def _step(self, new: list[Req], running: list[Req]) -> None:
        mode, step_s = choose_mode(self, running)
        step = next(self._steps)
        chunked = step_s > self.step_s  # a long prompt: every step is one prefill chunk
        if new or chunked:
            tokens = 8192 if chunked else sum(r.prompt_tokens for r in new)
            queued = len([r for r in list(self.waiting) if r.kind == "user"])
            self.metrics.prefill(len(new), tokens, len(running), self.parked, queued)
            if chunked or any(r.kind != "health" for r in new):
                log(
                    f"Prefill batch, #new-seq: {len(new)}, #new-token: {tokens}, #cached-token: 0, token usage: "
                    f"{self.metrics.token_usage:.2f}, #running-req: {len(running) - len(new)}, #queue-req: {queued}, "
                    f"#pending-token: 0, cuda graph: False, input throughput (token/s): {tokens / max(step_s, 1e-3):.2f}",
                    self.prefix,
                )
        kind, _, fault_name = mode.partition(":")
        batch: dict[str, object] = {"op": "step", "step": step, "step_s": step_s, "mode": kind}
        if kind == "desync":
            batch["ahead"] = [self.tp_size - 1]
        if kind in ("desync", "spin"):
            self.wedged = fault_name
            self.health_busy_path = fault_name not in ("watchdog_disabled_silent_wedge", "dp_rank_wedge")
        if kind == "spin":
            batch["ignore_sigterm"] = fault_name == "custom_allreduce_spin_sigterm_immune"
            batch["kernel"] = "spec" if fault_name == "spec_decode_kernel_spin" else "allreduce"
        self.batch_active_since = time.monotonic()
        self.step_due = self.batch_active_since + step_s
        try:
            for conn in self.conns:
                conn.send(batch)
        except (OSError, ValueError):
            self.dead = True
            return
        for leader in self.leaders:
            if not self._wait_done(leader):
                return
        if self.cross_node is not None:
            self.cross_node(batch)
        self.batch_active_since = self.step_due = None
        self.forward_ct += 1
        self.last_receive_tstamp = self.snapshot_at = time.time()
        self._emit(running)

    def _wait_done(self, leader: Connection) -> bool:
        """Wait for a TP group's answer, polling so a stop is honoured; a wedged group never answers."""
        while not self.stopping:
            try:
                if leader.poll(0.2):
                    leader.recv()
                    return True
            except (EOFError, OSError):
                self.dead = True
                return False
            if self.health_busy_path and self.wedged:
                self.last_receive_tstamp = time.time()
        return False

    def _emit(self, running: list[Req]) -> None:
        now = time.monotonic()
        finished: list[Req] = []
        decode = 0
        for req in running:
            if req.stuck:
                continue
            token = req.tokens[req.pos]
            req.pos += 1
            decode += 1
            if req.first_token_at is None:
                req.first_token_at = now
                if req.kind == "user":
                    self.metrics.tokenizer.ttft(now - req.created)
            elif req.kind == "user":
                self.metrics.tokenizer.itl(now - req.last_token_at)
            req.last_token_at = now
            done = req.pos >= len(req.tokens)
            req.sink([token], done, req.finish_reason if done else "")
            if done:
                finished.append(req)
        self.metrics.decode_step(decode)
        for req in finished:
            if req.kind == "user":
                self.metrics.tokenizer.finished(req.prompt_tokens, len(req.tokens), now - req.created)
        with self.cond:
            self.running = [r for r in self.running if r not in finished]
            running_now = len(self.running)
        if self.forward_ct % self.decode_log_interval == 0 and running_now:
            self.metrics.log_stats(
                running_now, len([r for r in self.waiting if r.kind == "user"]), self.parked
            )
            log(
                f"Decode batch, #running-req: {running_now}, #token: {running_now * 64}, token usage: "
                f"{self.metrics.token_usage:.2f}, cuda graph: True, gen throughput (token/s): "
                f"{running_now / max(self.step_s, 1e-3):.2f}, #queue-req: 0",
                self.prefix,
            )


def _drop(tokens: list[str], done: bool, reason: str) -> None:
    """The sink of health requests: SGLang discards their output."""
    del tokens, done, reason
