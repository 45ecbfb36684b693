"""The one owner of a server's state: lifecycle state, run, open incident, ladder levels, restart counts.

Nothing else changes them: the loop, the watch, the recovery and the group steps call the methods here, and a
move the lifecycle does not allow (an illegal transition, a second run while one is owned) raises `IllegalMove`
instead of being logged and ignored. What must survive the daemon (run id, PIDs, levels, history, the open
incident) is persisted through the state file on every change; the metrics of state read `gauges()` at scrape
time.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from policies.argv import redact as redact_argv
from policies.states import ServerState, check_transition
from supervisor.loop.clock import Clock
from supervisor.loop.host import RunHandle
from supervisor.records.incident import Incident
from supervisor.records.statefile import ServerRecord
from supervisor.reporting.metrics import ServerGauges

S = ServerState


@dataclass(frozen=True)
class FoundRun:
    """A previous daemon's run of this server, as its record tells (to adopt or to reap)."""

    run_id: str
    identity: dict[str, Any]
    argv: tuple[str, ...]  # as launched, secrets masked
    spec: str
    log_path: str
    log_offset: int
    detached: bool


class IllegalMove(RuntimeError):
    """A change of a server's state that its lifecycle forbids (a bug: the loop fails the server safely)."""


class ServerOwner:
    """The state of one server and every change to it."""

    def __init__(
        self,
        name: str,
        record: ServerRecord,
        clock: Clock,
        persist: Callable[[], None],
        changed: Callable[[], None],
        log: Any,
    ) -> None:
        self.name = name
        self._record = record
        self._clock = clock
        self._persist = persist
        self._changed = changed
        self._log = log
        self._state = S.STOPPED
        self._since = clock.wall()
        self._reason = "not started"
        self._run: RunHandle | None = None
        self._run_id = ""
        self._argv: tuple[str, ...] = ()
        self._launches = 0
        self._started_at = 0.0  # monotonic, this launch
        self._serving_since: float | None = None  # monotonic, this launch
        self._streak: list[float] = []  # monotonic times of the restarts of the current streak
        self._restarts: Counter[str] = Counter()  # fault kind -> restarts initiated
        self._incident: Incident | None = None
        self._detected: float | None = None  # monotonic: when the open incident was detected
        self._unproven = ""
        self.released_at: float | None = None  # monotonic: when the last run was released (None: none yet)
        self._paused = False
        self._before_pause = S.STOPPED
        self._adopted: dict[str, Any] | None = None  # how this daemon came to own the run, when it adopted it

    # ---- reading ----------------------------------------------------------------------------------------------
    @property
    def state(self) -> ServerState:
        return self._state

    @property
    def since(self) -> float:
        """Wall time of the last change of state."""
        return self._since

    @property
    def reason(self) -> str:
        return self._reason

    @property
    def run(self) -> RunHandle | None:
        return self._run

    @property
    def run_id(self) -> str:
        return self._run_id

    @property
    def argv(self) -> tuple[str, ...]:
        """The argv of the current (or last) launch."""
        return self._argv

    @property
    def launches(self) -> int:
        return self._launches

    @property
    def started_at(self) -> float:
        return self._started_at

    @property
    def serving_since(self) -> float | None:
        return self._serving_since

    @property
    def streak(self) -> tuple[float, ...]:
        return tuple(self._streak)

    @property
    def restart_count(self) -> int:
        return sum(self._restarts.values())

    @property
    def incident(self) -> Incident | None:
        return self._incident

    @property
    def detected_at(self) -> float | None:
        return self._detected

    @property
    def unproven(self) -> str:
        return self._unproven

    @property
    def paused(self) -> bool:
        return self._paused

    @property
    def levels(self) -> dict[str, int]:
        return dict(self._record.levels)

    @property
    def history(self) -> tuple[tuple[str, int], ...]:
        return tuple((str(h[0]), int(h[1])) for h in self._record.history)

    @property
    def rung(self) -> int:
        """The highest active ladder level (0 = the configured flags)."""
        return max(self._record.levels.values(), default=0)

    @property
    def group_generation(self) -> int:
        return self._record.group_generation

    @property
    def adopted(self) -> dict[str, Any] | None:
        """When and by which daemon version the current run was adopted (None: this daemon launched it)."""
        return self._adopted

    def found_run(self) -> FoundRun | None:
        """The run a previous daemon recorded, when it recorded enough to try adopting it."""
        rec = self._record
        if not rec.pid or not rec.identity or not rec.run_id or not rec.log_path:
            return None
        return FoundRun(
            rec.run_id,
            dict(rec.identity),
            tuple(rec.argv),
            rec.spec,
            rec.log_path,
            rec.log_offset,
            rec.detached,
        )

    @property
    def previous_run(self) -> tuple[str, int | None]:
        """The run id and main PID a previous daemon recorded."""
        return self._record.run_id, self._record.pid

    def gauges(self) -> ServerGauges:
        """What the metrics read at scrape time."""
        return ServerGauges(
            self.name, self._state.value, self.rung, dict(self._restarts), bool(self._unproven)
        )

    # ---- the lifecycle ----------------------------------------------------------------------------------------
    def transition(self, new: ServerState, reason: str) -> None:
        """Change state (checked against the table), log, persist, tell the daemon; the same state only updates
        the reason."""
        if new == self._state:
            self._reason = reason
            return
        problem = check_transition(self._state, new)
        if problem:
            self._log.error("state.illegal_transition", old=self._state.value, new=new.value, problem=problem)
            raise IllegalMove(problem)
        self._log.info("state.transition", old=self._state.value, new=new.value, reason=reason)
        self._state, self._since, self._reason = new, self._clock.wall(), reason
        self._record.state = new.value
        self._persist()
        self._changed()

    def pause(self, reason: str) -> None:
        """Maintenance: remember where the server was, then `paused`."""
        if self._paused:
            return
        self._paused, self._before_pause = True, self._state
        self.transition(S.PAUSED, reason)

    def resume(self, back: Callable[[ServerState, bool, bool], ServerState | None], reason: str) -> None:
        """End the pause; `back(state before, running, served this launch)` says where to (None: launch anew)."""
        if not self._paused:
            return
        self._paused = False
        target = back(self._before_pause, self._run is not None, self._serving_since is not None)
        if target is not None:
            self.transition(target, reason)

    # ---- the run ----------------------------------------------------------------------------------------------
    def begin_run(
        self,
        run: RunHandle,
        run_id: str,
        argv: tuple[str, ...],
        identity: Mapping[str, Any] | None = None,
        spec: str = "",
        log_path: str = "",
    ) -> None:
        """A launch now owns `run`; refused while another run is owned (never two trees). What a later daemon
        needs to adopt it (identity, spec, log file) is recorded with it."""
        if self._run is not None:
            raise IllegalMove(f"launch while run {self._run_id} (pid {self._run.pid}) is still owned")
        self._run, self._run_id, self._argv, self._adopted = run, run_id, argv, None
        self._launches += 1
        self._started_at, self._serving_since = self._clock.monotonic(), None
        rec = self._record
        rec.run_id, rec.pid, rec.pgid = run_id, run.pid, run.pgid
        rec.argv = redact_argv(list(argv))
        rec.identity, rec.spec, rec.log_path = dict(identity or {}), spec, log_path
        rec.log_offset, rec.detached = 0, False
        self._persist()

    def adopt_run(
        self, run: RunHandle, run_id: str, argv: tuple[str, ...], adopted: Mapping[str, Any]
    ) -> None:
        """A previous daemon's run is this daemon's now (proven the same: supervisor.loop.adoption)."""
        if self._run is not None:
            raise IllegalMove(f"adoption while run {self._run_id} (pid {self._run.pid}) is still owned")
        self._run, self._run_id, self._argv, self._adopted = run, run_id, argv, dict(adopted)
        self._launches += 1
        self._started_at, self._serving_since = self._clock.monotonic(), None
        self._record.detached = False
        self._persist()

    def detach_run(self, log_offset: int) -> RunHandle | None:
        """A handover: the run stays alive for the next daemon, recorded with how far its log was read."""
        run, self._run = self._run, None
        self._record.log_offset, self._record.detached = log_offset, run is not None
        self._persist()
        return run

    def set_argv(self, argv: tuple[str, ...]) -> None:
        """The argv a launch is about to use (kept even if it cannot start, for incidents and status)."""
        self._argv = argv

    def end_run(self, now: float) -> RunHandle | None:
        """The run is released (at monotonic `now`): forget it (the caller closes the handle)."""
        run, self._run = self._run, None
        self.released_at = now
        self.forget_previous_run()
        return run

    def forget_previous_run(self) -> None:
        """A previous daemon's run is reaped: its record is cleared."""
        rec = self._record
        rec.pid = rec.pgid = None
        rec.identity, rec.detached = {}, False
        self._persist()

    def mark_serving(self) -> float:
        """Startup proven: serving since now (monotonic, returned)."""
        self._serving_since = self._clock.monotonic()
        return self._serving_since

    def set_unproven(self, why: str) -> bool:
        """Serving without a passing canary (`why`), or proven (''); True when that changed."""
        changed = bool(why) != bool(self._unproven)
        self._unproven = why
        return changed

    # ---- incidents --------------------------------------------------------------------------------------------
    def open_incident(self, incident: Incident, detected_at: float) -> None:
        """The incident the next serving resolves (held in memory: `begin_recovery` also puts it on disk)."""
        self._incident, self._detected = incident, detected_at

    def begin_recovery(
        self, levels: Mapping[str, int], step: tuple[str, int] | None, incident: Incident, detected_at: float
    ) -> None:
        """A recovery is decided: its ladder levels and its incident are on disk together, in one write, before
        any step a daemon death could interrupt (the next daemon completes the incident)."""
        if step is not None:
            self._record.history.append([step[0], step[1]])
        self._record.levels = {k: v for k, v in levels.items() if v}
        self._incident, self._detected = incident, detected_at
        self._record.open_incident = incident.id
        self._persist()

    def update_incident(self, incident: Incident) -> None:
        """A later version of the open incident (same id)."""
        if self._incident is None or self._incident.id != incident.id:
            raise IllegalMove(f"update of incident {incident.id}, which is not the open one")
        self._incident = incident

    def close_incident(self) -> tuple[Incident, float] | None:
        """Serving again: the open incident and when it was detected, and no open incident any more."""
        found = self._incident
        detected = self._detected if self._detected is not None else self._started_at
        self._incident, self._detected = None, None
        if self._record.open_incident:
            self._record.open_incident = ""
            self._persist()
        return None if found is None else (found, detected)

    def interrupted_incident(self) -> str:
        """The incident a dead daemon was recovering from ('' if none); cleared from the record."""
        found, self._record.open_incident = self._record.open_incident, ""
        return found

    # ---- ladders and restarts ---------------------------------------------------------------------------------
    def set_levels(self, levels: Mapping[str, int], step: tuple[str, int] | None = None) -> None:
        """The ladder levels the next launch uses; `step` is the (key, rung) entry the history records."""
        if step is not None:
            self._record.history.append([step[0], step[1]])
        self._record.levels = {k: v for k, v in levels.items() if v}
        self._persist()

    def follow_generation(self, number: int, levels: Mapping[str, int]) -> None:
        """A multi-node group's generation: its levels, and the number this server launched."""
        self._record.group_generation = number
        self.set_levels(levels)

    def count_restart(self, fault: str, streak: bool = True) -> None:
        """A restart the supervisor initiates for `fault` (part of the streak the backoff budget counts)."""
        self._restarts[fault] += 1
        if streak:
            self._streak.append(self._clock.monotonic())

    def end_streak(self) -> None:
        """Stable serving (or an operator's restart) ends the restart streak."""
        self._streak.clear()
