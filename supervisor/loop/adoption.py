"""A daemon that starts and finds its server's run still alive adopts it instead of paying a model load again —
or says why not and reaps it as before. A planned handover (`SIGUSR2`, the daemon re-executes itself) detaches
every run first, so the daemon that follows adopts them exactly where this one left.

A run whose recovery was under way when the previous daemon died is not adopted: that daemon had decided to
replace it, and the replacement completes its incident. Adopting proves the run is the same and whole
(policies.spec): the boot id, the main pid and its start time,
the run marker in its environment, every rank present, no other holder of its GPUs, the launch spec the config
asks for now, and `/server_info` agreeing on the model and tp size. The adopted run is then watched like a launch
that has just begun (`starting` until `/health` is 200 and the canary passes; its startup budget counts from the
adoption), so a run that does not answer in time is recovered with an incident, like any stalled launch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from policies.argv import redact
from policies.spec import Found, adoption_refusal, spec_hash
from policies.states import ServerState
from supervisor.loop.recovery import reap_previous

if TYPE_CHECKING:
    from supervisor.loop.context import Loop

S = ServerState


def desired_spec(loop: Loop) -> tuple[tuple[str, ...], str]:
    """The argv the config launches now (with the recorded ladder levels) and its spec hash."""
    argv = loop.current_argv()
    return argv, spec_hash(argv, dict(loop.cfg.env), loop.cfg.gpus)


async def adopt_previous(loop: Loop, version: str) -> bool:
    """Adopt a previous daemon's run of this server (True), or reap whatever of it is left (False)."""
    owner, host = loop.owner, loop.svc.host
    found = owner.found_run()
    if found is None:
        await reap_previous(loop)
        return False
    attached = await host.attach(
        found.identity,
        loop.marker,
        found.run_id,
        found.log_path,
        found.log_offset if found.detached else None,
    )
    argv, spec = desired_spec(loop)
    command = len(loop.cfg.command)
    interrupted = owner.incident
    if interrupted is not None:  # the previous daemon had decided to replace this run: finish that
        why: str | None = f"a recovery was under way when the previous daemon stopped ({interrupted.id})"
    elif isinstance(attached, str):
        why = attached
    else:
        view = await host.adoption_view(
            loop.cfg, attached.pid, found.run_id, loop.marker, loop.watch.titles()
        )
        why = adoption_refusal(
            Found(
                identity_problem=None,
                recorded_spec=found.spec,
                desired_spec=spec,
                recorded_args=tuple(found.argv[command:]),
                desired_args=tuple(redact(list(argv))[command:]),
                missing_ranks=view.missing_ranks,
                foreign_holders=view.foreign_holders,
                server_info_problem=view.server_info_problem,
            )
        )
    if why is not None:
        if not isinstance(attached, str):
            attached.close()
        loop.log.warning("adopt.refused", run_id=found.run_id, pid=found.identity.get("pid"), reason=why)
        loop.svc.incidents.notice(
            loop.name, loop.clock.wall(), "adopt_refused", "reaped", f"not adopted: {why}",
            {"run_id": found.run_id, "reason": why}, owner.argv, owner.rung,
        )  # fmt: skip
        await reap_previous(loop)
        return False
    assert not isinstance(attached, str)
    adopted: dict[str, Any] = {
        "at": loop.clock.wall(),
        "by_version": version,
        "run_id": found.run_id,
        "handover": found.detached,
    }
    owner.adopt_run(attached, found.run_id, argv, adopted)
    loop.log.info("adopt.adopted", run_id=found.run_id, pid=attached.pid, handover=found.detached)
    owner.transition(S.STARTING, "adopted: waiting for /health 200 and the canary")
    return True


async def detach(loop: Loop) -> None:
    """A handover: leave the run alive for the next daemon, with how far its log was read; stop watching it."""
    run = loop.owner.run
    left = loop.owner.detach_run(run.log_offset() if run is not None else 0)
    if left is not None:
        left.close()
        loop.log.info("adopt.detached", run_id=loop.owner.run_id, pid=left.pid)
    await loop.watch.aclose()
