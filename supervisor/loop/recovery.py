"""Acting on a fault or a command: incident, forensics, stop, reap, release, verify, backoff — or failed.

Every step goes through the loop's `Host`, every state change through `ServerLoop.transition`, every decision
comes from `policies.triage.plan`.
"""

from __future__ import annotations

import contextlib
from dataclasses import replace
from typing import TYPE_CHECKING

from policies.ladders import PastIncident
from policies.model import Fault
from policies.plan import build_argv
from policies.states import ServerState
from policies.triage import PlanFacts, plan
from policies.triage import spawn_failure as triage_spawn_failure
from supervisor.host.forensics import BUDGET_S, Evidence
from supervisor.host.launcher import SpawnFailed
from supervisor.host.release import ReleaseReport
from supervisor.loop.commands import Command, Outcome
from supervisor.records.incident import Incident

if TYPE_CHECKING:
    from supervisor.loop.server import ServerLoop

S = ServerState
RELEASE_SLACK_S = 30.0  # beyond drain grace and the release deadline, before the loop counts as wedged

__all__ = [
    "Outcome",
    "plan_facts",
    "planned_restart",
    "reap_previous",
    "recover",
    "release_run",
    "spawn_failure",
    "stop_for_good",
]


async def reap_previous(loop: ServerLoop) -> None:
    """Processes of an earlier run of this server (found by marker) are reaped before anything launches.

    We reap rather than adopt: the old tree's stdout was a pipe to the dead daemon, its launch was not watched,
    and its flags may predate the current config — relaunching costs a load but is certain.
    """
    found = await loop.svc.host.find_marked(loop.marker)
    if not found and not loop.record.pid:
        return
    loop.log.warning("recovery.reap_previous", pids=[p.pid for p in found], run_id=loop.record.run_id)
    report = await release_run(loop, mode="kill", any_run_of=loop.marker, main_pid=None, pgid=None)
    if not report.ok:
        what = "could not reap the previous run"
        if loop.open_incident is not None:  # the recovery a dead daemon left unfinished
            loop.open_incident = loop.svc.incidents.page(loop.open_incident, f"{what}: {report.reason}")
        else:
            loop.svc.incidents.notice(
                loop.name, loop.clock.wall(), "release_failed", "failed", f"{what}: {report.reason}",
                {"release": report.to_json()}, loop.argv, loop.rung, severity="page",
            )  # fmt: skip
        await until_released(loop, report, what)


def spawn_failure(loop: ServerLoop, failed: SpawnFailed) -> Outcome:
    """The launch command could not start at all: the triage fails it (no relaunch will cure it)."""
    return Outcome(fault=triage_spawn_failure(failed.reason, loop.argv, loop.clock.monotonic()))


def plan_facts(loop: ServerLoop) -> PlanFacts:
    """What the triage needs of this server to plan a recovery."""
    return PlanFacts(
        role=loop.cfg.role.value,
        args=loop.argv[len(loop.cfg.command) :],
        restarts=tuple(loop.restarts),
        serving_since=loop.serving_since,
        restart=loop.svc.config.supervisor.restart,
        jitter=loop.rng.random(),
        history=tuple(PastIncident(str(h[0]), int(h[1])) for h in loop.record.history),
        levels=dict(loop.record.levels),
        ladders=loop.ladders,
        parser_policy=loop.cfg.policy.parser_policy,
    )


async def recover(loop: ServerLoop, fault: Fault) -> None:
    """Incident, forensics, kill, release, verify, then backoff and relaunch — or failed."""
    now = loop.clock.monotonic()
    decided = plan(fault, plan_facts(loop), now)
    if decided.streak_over:
        loop.restarts.clear()
    chosen = decided.plan
    latency = max(0.0, now - fault.onset_at) if fault.onset_at is not None else None
    incident = loop.svc.incidents.fault(
        loop.name, loop.clock.wall(), fault, chosen, loop.argv, loop.rung, latency
    )
    loop.open_incident, loop.detected_mono = incident, now
    if chosen.action == "alert":
        return
    # the chosen rung is on disk before any step that a daemon death could interrupt
    if chosen.ladder_key is not None:
        loop.record.history.append([chosen.ladder_key, chosen.rung])
    loop.record.levels = dict(chosen.levels)
    loop.record.open_incident = incident.id
    loop.svc.metrics.set_rung(loop.name, loop.rung)
    loop.svc.save_state()
    loop.transition(S.RECOVERING, f"{fault.kind}: {fault.reason}")
    forensics = await _forensics(loop, incident) if loop.run is not None else ""
    report = await release_run(loop, mode="kill")
    loop.svc.metrics.observe_gpu_release(loop.name, report.steps.get("total", 0.0))
    _, diff = build_argv(loop.cfg.args, loop.record.levels, loop.ladders)
    key = chosen.ladder_key
    incident = replace(
        incident,
        forensics_path=forensics,
        argv_after=loop.current_argv(),
        flags_added=tuple(line[1:] for line in diff.lines() if line.startswith(("+", "~"))),
        flags_removed=tuple(line[1:] for line in diff.lines() if line.startswith("-")),
        evidence={
            **incident.evidence,
            "release": report.to_json(),
            "flag_notes": [n for n in loop.skipped_rungs if key and f".{key}[" in n],
        },
    )
    loop.open_incident = incident
    loop.svc.incidents.update(incident)
    loop.svc.save_state()
    if not report.ok:
        loop.open_incident = loop.svc.incidents.page(incident, f"release failed: {report.reason}")
        await until_released(loop, report)
        return
    if chosen.action == "fail":
        loop.transition(S.FAILED, chosen.reason)
        loop.open_incident = loop.svc.incidents.page(incident, chosen.reason)
        if chosen.slow_retry and chosen.delay_s > 0:
            await loop.sleep_interruptible(chosen.delay_s)
        else:
            await loop.wait_for_operator()
        return
    loop.svc.metrics.restart(loop.name, fault.kind)
    loop.restarts.append(now)
    loop.restart_count += 1
    loop.transition(S.BACKOFF, f"relaunch in {chosen.delay_s:.1f}s: {chosen.reason}")
    await loop.sleep_interruptible(chosen.delay_s)


async def until_released(loop: ServerLoop, report: ReleaseReport, what: str = "release failed") -> None:
    """A tree that would not die (a rank in D state, a GPU held): `failed` until an operator acts, and then the
    release is verified again — nothing is launched onto GPUs that are not verified free."""
    while not report.ok and not loop.stopping:
        loop.transition(S.FAILED, f"{what}: {report.reason}")
        await loop.wait_for_operator()
        if loop.stopping:
            return
        report = await release_run(loop, mode="kill", any_run_of=loop.marker, main_pid=None, pgid=None)


async def _forensics(loop: ServerLoop, incident: Incident) -> str:
    run = loop.run
    reader = loop.svc.host.gpu_reader(loop.cfg.gpus)

    async def gpus() -> list[dict[str, object]]:
        return reader() if reader is not None else []

    evidence = Evidence(
        rank_pids=loop.watch.rank_pids(),
        log_tail=run.tail(500) if run else [],
        probes=loop.watch.snapshot(),
        argv=loop.argv,
        env=dict(loop.cfg.env),
        gpus=gpus,
    )
    loop.busy(BUDGET_S + RELEASE_SLACK_S)
    return await loop.svc.host.forensics(loop.svc.config.supervisor, evidence, incident)


async def release_run(
    loop: ServerLoop,
    mode: str,
    any_run_of: str | None = None,
    main_pid: int | None = -1,
    pgid: int | None = -1,
) -> ReleaseReport:
    """Stop this run and release everything it held (`main_pid=None` for a previous daemon's leftovers)."""
    run = loop.run
    sup = loop.svc.config.supervisor
    loop.busy(loop.cfg.drain_grace_s + sup.release_deadline_s + RELEASE_SLACK_S)
    report = await loop.svc.host.release(
        loop.cfg,
        sup,
        main_pid=(run.pid if run else None) if main_pid == -1 else main_pid,
        pgid=(run.pgid if run else None) if pgid == -1 else pgid,
        run_id=loop.run_id if any_run_of is None else (loop.record.run_id or ""),
        mode=mode,
        known=loop.watch.known_descendants() if any_run_of is None else [],
        any_run_of=any_run_of,
    )
    loop.busy_until = 0.0
    loop.beat()
    loop.log.info("recovery.release", **report.to_json())
    if run is not None:
        run.close()
    loop.run = None
    loop.record.pid = loop.record.pgid = None
    loop.svc.save_state()
    return report


def promote(loop: ServerLoop) -> None:
    """Lower the highest ladder one rung; recorded in the history so a returning fault steps back up at once."""
    levels = loop.record.levels
    key = max(levels, key=lambda k: levels[k])
    level = levels[key] - 1
    loop.record.history.append([key, level])
    if level:
        levels[key] = level
    else:
        del levels[key]
    loop.svc.metrics.set_rung(loop.name, loop.rung)
    loop.svc.save_state()


async def planned_restart(loop: ServerLoop, cmd: Command) -> None:
    """An operator restart (or a promotion): an incident with who and why, drain, release, relaunch at once."""
    if cmd.kind == "promote":
        promote(loop)
    loop.operator_entry(cmd.kind, cmd)
    loop.transition(S.STOPPING, f"restart requested by {cmd.actor}: {cmd.reason}")
    report = await release_run(loop, mode="drain")
    cmd.answer("restarted" if report.ok else f"release failed: {report.reason}")
    if not report.ok:
        loop.transition(S.FAILED, f"release failed: {report.reason}")
        await loop.wait_for_operator()
        return
    loop.transition(S.STOPPED, f"stopped for a {cmd.kind}; relaunching")


async def stop_for_good(loop: ServerLoop) -> None:
    """Daemon shutdown: drain and release, then stopped."""
    if loop.run is not None or loop.state not in (S.STOPPED, S.FAILED):
        with contextlib.suppress(Exception):
            loop.transition(S.STOPPING, "daemon stopping")
        report = await release_run(loop, mode="drain")
        loop.transition(S.STOPPED if report.ok else S.FAILED, report.reason)
    await loop.watch.aclose()
