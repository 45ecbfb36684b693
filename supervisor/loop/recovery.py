"""Carrying out a decided fault step or a command: incident, forensics, stop, reap, release, verify, backoff — or
failed.

The plan comes with the step (`policies.decide.Next`, decided once by the loop); every change of the server's
state goes through its owner, every effect through the loop's `Host`.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from policies.decide import Next
from policies.model import Fault
from policies.plan import build_argv
from policies.states import ServerState
from policies.triage import spawn_failure as triage_spawn_failure
from supervisor.gateway.drain import leave_for_planned_stop
from supervisor.host.forensics import BUDGET_S, Evidence
from supervisor.host.launcher import SpawnFailed
from supervisor.host.release import ReleaseReport
from supervisor.loop.commands import Command, Outcome
from supervisor.records.incident import Incident
from supervisor.redaction import server_api_key

if TYPE_CHECKING:
    from supervisor.loop.context import Loop

S = ServerState
RELEASE_SLACK_S = 30.0  # beyond drain grace and the release deadline, before the loop counts as wedged


async def reap_previous(loop: Loop) -> None:
    """Processes of an earlier run of this server (found by marker) are reaped before anything launches.

    We reap rather than adopt: the old tree's stdout was a pipe to the dead daemon, its launch was not watched,
    and its flags may predate the current config — relaunching costs a load but is certain.
    """
    found = await loop.svc.host.find_marked(loop.marker)
    run_id, pid = loop.owner.previous_run
    if not found and not pid:
        return
    loop.log.warning("recovery.reap_previous", pids=[p.pid for p in found], run_id=run_id)
    report = await release_run(loop, mode="kill", any_run_of=loop.marker)
    loop.owner.forget_previous_run()
    if not report.ok:
        await _unreapable(loop, report, "could not reap the previous run")


async def no_earlier_run(loop: Loop) -> bool:
    """The invariant before every launch: no process of an earlier run of this server (its marker, on any
    process or holder of its GPUs) is alive. One found is reaped first (a bug elsewhere costs an incident,
    never a second tree on the same GPUs); False when it cannot be reaped (failed) or the daemon stops."""
    alive = await loop.svc.host.earlier_run(loop.marker, loop.cfg)
    if not alive and loop.owner.run is None:
        return True
    loop.log.error("launch.refused", alive=alive, hint="an earlier run of this server is still alive")
    loop.svc.incidents.notice(
        loop.name, loop.clock.wall(), "launch_refused", "reaped",
        f"launch refused: an earlier run is alive ({'; '.join(alive) or 'a run is still owned'})",
        {"alive": alive}, loop.owner.argv, loop.owner.rung, severity="page",
    )  # fmt: skip
    report = await release_run(loop, mode="kill", any_run_of=loop.marker)
    if not report.ok:
        await _unreapable(loop, report, "launch refused: could not reap an earlier run")
        return False
    return not loop.stopping


async def _unreapable(loop: Loop, report: ReleaseReport, what: str) -> None:
    """An earlier run that would not die: the open incident (or a new one) pages, then `failed` until released."""
    incident = loop.owner.incident
    if incident is not None:  # the recovery a dead daemon left unfinished
        loop.owner.update_incident(loop.svc.incidents.page(incident, f"{what}: {report.reason}"))
    else:
        loop.svc.incidents.notice(
            loop.name, loop.clock.wall(), "release_failed", "failed", f"{what}: {report.reason}",
            {"release": report.to_json()}, loop.owner.argv, loop.owner.rung, severity="page",
        )  # fmt: skip
    await until_released(loop, report, what)


def spawn_failure(loop: Loop, failed: SpawnFailed) -> Outcome:
    """The launch command could not start at all: the triage names the fault, the loop decides (fail)."""
    fault = triage_spawn_failure(failed.reason, loop.owner.argv, loop.clock.monotonic())
    return Outcome(fault=fault, decided=loop.decide(fault))


async def recover(loop: Loop, fault: Fault, decided: Next) -> None:
    """Carry out a decided recovery: incident, forensics, kill, release, verify, then backoff (relaunch) or
    failed — as `decided.plan` says; nothing here decides again."""
    owner = loop.owner
    now = loop.clock.monotonic()
    chosen = decided.plan
    latency = max(0.0, now - fault.onset_at) if fault.onset_at is not None else None
    incident = loop.svc.incidents.draft_fault(
        loop.name, loop.clock.wall(), fault, chosen, owner.argv, owner.rung, latency
    )
    # the chosen rung and the incident's id are on disk before the journal shows the incident and before any
    # step that a daemon death could interrupt: a daemon stopped after either finds the recovery to complete
    step = (chosen.ladder_key, chosen.rung) if chosen.ladder_key is not None else None
    owner.begin_recovery(chosen.levels, step, incident, now)
    loop.svc.incidents.record_fault(incident)
    owner.transition(S.RECOVERING, f"{fault.kind}: {fault.reason}")
    forensics = await _forensics(loop, incident) if owner.run is not None else ""
    report = await release_run(loop, mode="kill")
    _, diff = build_argv(loop.cfg.args, owner.levels, loop.ladders)
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
    owner.update_incident(incident)
    loop.svc.incidents.update(incident)
    if not report.ok:
        owner.update_incident(loop.svc.incidents.page(incident, f"release failed: {report.reason}"))
        await until_released(loop, report)
        return
    if chosen.action == "fail":
        owner.transition(S.FAILED, chosen.reason)
        owner.update_incident(loop.svc.incidents.page(incident, chosen.reason))
        if chosen.slow_retry and chosen.delay_s > 0:
            await loop.sleep_interruptible(chosen.delay_s)
        else:
            await loop.wait_for_operator()
        return
    owner.count_restart(fault.kind)
    owner.transition(S.BACKOFF, f"relaunch in {chosen.delay_s:.1f}s: {chosen.reason}")
    await loop.sleep_interruptible(chosen.delay_s)


async def until_released(loop: Loop, report: ReleaseReport, what: str = "release failed") -> None:
    """A tree that would not die (a rank in D state, a GPU held): `failed` until an operator acts, and then the
    release is verified again — nothing is launched onto GPUs that are not verified free."""
    while not report.ok and not loop.stopping:
        loop.owner.transition(S.FAILED, f"{what}: {report.reason}")
        await loop.wait_for_operator()
        if loop.stopping:
            return
        report = await release_run(loop, mode="kill", any_run_of=loop.marker)


async def _forensics(loop: Loop, incident: Incident) -> str:
    run = loop.owner.run
    reader = loop.svc.host.gpu_reader(loop.cfg.gpus)

    async def gpus() -> list[dict[str, object]]:
        return reader() if reader is not None else []

    evidence = Evidence(
        rank_pids=loop.watch.rank_pids(),
        log_tail=run.tail(500) if run else [],
        probes=loop.watch.snapshot(),
        argv=loop.owner.argv,
        env=dict(loop.cfg.env),
        gpus=gpus,
    )
    loop.busy(BUDGET_S + RELEASE_SLACK_S)
    return await loop.svc.host.forensics(loop.svc.config.supervisor, evidence, incident)


async def release_run(loop: Loop, mode: str, any_run_of: str | None = None) -> ReleaseReport:
    """Stop this run and release everything it held; with `any_run_of`, every process of any run of the
    server too (a previous daemon's leftovers). Its duration is observed whether it succeeded or not."""
    owner = loop.owner
    run = owner.run
    sup = loop.svc.config.supervisor
    loop.busy(loop.cfg.drain_grace_s + sup.release_deadline_s + RELEASE_SLACK_S)
    began = loop.clock.monotonic()
    previous_id, _ = owner.previous_run
    report = await loop.svc.host.release(
        loop.cfg,
        sup,
        main_pid=run.pid if run else None,
        pgid=run.pgid if run else None,
        run_id=owner.run_id if run is not None else previous_id,
        mode=mode,
        known=loop.watch.known_descendants() if run is not None else [],
        any_run_of=any_run_of,
    )
    loop.svc.metrics.observe_gpu_release(loop.name, loop.clock.monotonic() - began)
    loop.busy(0)
    loop.beat()
    loop.log.info("recovery.release", **report.to_json())
    ended = owner.end_run(loop.clock.monotonic())
    if ended is not None:
        ended.close()
    return report


async def planned_restart(loop: Loop, cmd: Command) -> None:
    """An operator restart (or a promotion): an incident with who and why, drain, release, relaunch at once."""
    if cmd.promotion is not None:  # the levels policies.triage.promotion decided
        loop.owner.set_levels(cmd.promotion.levels, cmd.promotion.step)
    loop.operator_entry(cmd.kind, cmd)
    loop.owner.transition(S.STOPPING, f"restart requested by {cmd.actor}: {cmd.reason}")
    await _leave_gateway(loop)
    if loop.svc.gateway is not None:  # out while stopping by its state from here on; proven again to rejoin
        loop.svc.gateway.rejoin(loop.name)
    report = await release_run(loop, mode="drain")
    cmd.answer("restarted" if report.ok else f"release failed: {report.reason}")
    if not report.ok:
        loop.owner.transition(S.FAILED, f"release failed: {report.reason}")
        await loop.wait_for_operator()
        return
    loop.owner.transition(S.STOPPED, f"stopped for a {cmd.kind}; relaunching")


async def stop_for_good(loop: Loop) -> None:
    """Daemon shutdown: drain and release every process of this server (whatever state it is in), then
    stopped — nothing of ours is left."""
    owner = loop.owner
    if owner.state not in (S.STOPPED, S.STOPPING):
        owner.transition(S.STOPPING, "daemon stopping")
    if owner.run is not None:
        await _leave_gateway(loop)
    report = await release_run(loop, mode="drain", any_run_of=loop.marker)
    if owner.state is S.STOPPING:
        owner.transition(S.STOPPED if report.ok else S.FAILED, report.reason)
    await loop.watch.aclose()


async def _leave_gateway(loop: Loop) -> None:
    """A planned stop behind a gateway: out of rotation, the server's requests done (bounded), then the stop."""
    note = await leave_for_planned_stop(loop, server_api_key(loop.cfg))
    if note:
        loop.log.info("gateway.drained", result=note)
