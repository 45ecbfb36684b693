"""`sglang-supervisor drill SCENARIO`: on-call training — a fault injected live into a simulated server, narrated.

The drill builds the demo deployment (`supervisor.training.demo.demo_config`, 2 simulated GPUs) in a temporary directory,
runs the daemon in this process, prints the status URL and the `status --watch` command to follow it, waits until
the server serves and then `lead_in_s` more (time to open that pane), arms the fault through the simulator's
`POST /sim/fault`, drives the traffic its trigger needs, and tells what the supervisor sees and does: each state
transition with its reason, the incident (fault, evidence, action, rung, flags, forensics bundle), the time to detect
and the time back to serving. Everything it started is stopped before it returns; its directory (state, incident
journal, forensics, logs) is removed too unless `keep`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

import aiohttp
import structlog

from simulator.faults import CATALOG
from supervisor.daemon import Daemon
from supervisor.host import proctree
from supervisor.records.incident import Incident
from supervisor.records.journal import IncidentJournal
from supervisor.training.demo import DEMO_MODEL, PortBusy, pick_sglang_port, pick_status_port, workdir
from supervisor.training.scenarios import DRILLS, NOT_DRILLS, TP, Drill, drill_config

TIMEOUT = aiohttp.ClientTimeout(total=30)
LEAD_IN_S = 5.0


def run_drill(
    scenario: str,
    timeout_s: float = 180.0,
    out: TextIO = sys.stdout,
    *,
    port: int | None = None,
    sglang_port: int | None = None,
    keep: bool = False,
    lead_in_s: float = LEAD_IN_S,
) -> int:
    """Run one drill; 0 when the supervisor recovered (or raised the alert of an alert-only fault), 1 on
    timeout or when it gave up, 2 for a scenario that is not a drill or a port asked for that is taken.

    `port` is the status endpoint's port and `sglang_port` the simulated SGLang's (any free ones when None);
    `keep` keeps the drill's directory and says where it is; `lead_in_s` is the pause between serving and
    the fault."""
    drill = DRILLS.get(scenario)
    if drill is None:
        why = NOT_DRILLS.get(scenario, "unknown scenario").replace("NAME", scenario)
        print(f"{scenario!r} is not a drill: {why}.", file=out)
        print(f"valid drills: {', '.join(sorted(DRILLS))} (sglang-supervisor drill --list)", file=out)
        return 2
    try:
        ports = pick_status_port(port, 0), pick_sglang_port(sglang_port, None)
    except PortBusy as exc:
        print(f"drill: {exc}", file=out)
        return 2
    previous = structlog.get_config()
    with workdir("sglsup-drill-", keep) as root, open(root / "daemon.log", "a") as log:
        structlog.configure(
            processors=[
                structlog.processors.add_log_level,
                structlog.processors.TimeStamper(fmt="iso", utc=True),
                structlog.processors.JSONRenderer(),
            ],
            logger_factory=structlog.PrintLoggerFactory(file=log),
            cache_logger_on_first_use=False,
        )
        say = Narrator(out)
        try:
            return asyncio.run(_main(scenario, drill, root, ports, timeout_s, lead_in_s, keep, say))
        finally:
            structlog.configure(**previous)
            if keep:
                say.say(
                    f"kept: {root} (state/ with state.json, incidents.jsonl, forensics/; log/; daemon.log)"
                )


class Narrator:
    """Timestamped lines for the trainee."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.t0 = time.monotonic()

    def say(self, text: str, indent: bool = False) -> None:
        """One line, prefixed with the seconds since the drill began (or indented under the previous one)."""
        prefix = " " * 10 if indent else f"[{time.monotonic() - self.t0:6.1f}s] "
        print(prefix + text, file=self.out, flush=True)


async def _main(
    scenario: str,
    drill: Drill,
    root: Path,
    ports: tuple[int, int],
    timeout_s: float,
    lead_in_s: float,
    keep: bool,
    say: Narrator,
) -> int:
    config = drill_config(root, drill, *ports)
    daemon = Daemon(config)
    name = daemon.loops[0].name
    _hook_transitions(daemon, say)
    sim_url = f"http://127.0.0.1:{config.servers[0].http_port}"
    say.say(f"drill {scenario}: {CATALOG[scenario][1]}")
    say.say(f"expected: {drill.expect}", indent=True)
    say.say(f"deployment: server {name}, simulated {DEMO_MODEL} on TP {TP}, in {root}", indent=True)
    say.say(f"status: {daemon.status.url}/status", indent=True)
    say.say(f"follow along: sglang-supervisor status --watch --url {daemon.status.url}", indent=True)
    say.say(f"incident journal: {Path(config.supervisor.state_dir) / 'incidents.jsonl'}", indent=True)
    say.say(f"control token: {config.supervisor.http.token_file}", indent=True)
    say.say(f"daemon log (what journalctl would show): {root / 'daemon.log'}", indent=True)
    daemon_task = asyncio.create_task(daemon.run(), name="drill.daemon")
    code = 1
    try:
        async with aiohttp.ClientSession(timeout=TIMEOUT) as http:
            script = asyncio.create_task(_script(scenario, drill, daemon, sim_url, http, say, lead_in_s))
            done, _ = await asyncio.wait(
                {script, daemon_task}, timeout=timeout_s, return_when="FIRST_COMPLETED"
            )
            if script in done:
                code = script.result()
            elif daemon_task in done:
                error = None if daemon_task.cancelled() else daemon_task.exception()
                say.say(f"the daemon stopped before the drill ended{f': {error!r}' if error else ''}")
            else:
                say.say(f"TIMEOUT: no recovery within {timeout_s:.0f}s; see the state and reason above")
            script.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await script
    finally:
        say.say("stopping the daemon and the simulated server")
        daemon.stop_event.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(daemon_task, timeout=120)
        await asyncio.to_thread(_reap_leftovers, name, say)
    say.say("drill PASSED" if code == 0 else "drill FAILED")
    if not keep:
        say.say(f"{root} is removed now (--keep keeps it)")
    return code


def _hook_transitions(daemon: Daemon, say: Narrator) -> None:
    """Narrate every state change as it happens (the daemon calls `on_state_change` after each)."""
    last = {loop.name: loop.state.value for loop in daemon.loops}
    notify: Callable[[], None] = daemon.svc.on_state_change

    def changed() -> None:
        for loop in daemon.loops:
            if loop.state.value != last[loop.name]:
                say.say(f"{loop.name}: {last[loop.name]} → {loop.state.value} ({loop.reason})")
                last[loop.name] = loop.state.value
        notify()

    daemon.svc.on_state_change = changed


async def _script(
    scenario: str,
    drill: Drill,
    daemon: Daemon,
    sim_url: str,
    http: aiohttp.ClientSession,
    say: Narrator,
    lead_in_s: float,
) -> int:
    name = daemon.loops[0].name
    status_url = f"{daemon.status.url}/status"
    await _until(lambda s: s.get("state") == "serving", http, status_url, name)
    if lead_in_s > 0:
        say.say(f"serving; the fault comes in {lead_in_s:g} s (--lead-in): watch it on {daemon.status.url}")
        await asyncio.sleep(lead_in_s)
    injected = time.time()
    async with http.post(f"{sim_url}/sim/fault", json={"name": scenario, **drill.trigger}) as resp:
        armed = (await _json(resp)).get("armed") if resp.status == 200 else None
    trigger = drill.trigger or CATALOG[scenario][0]
    say.say(f'inject: POST {sim_url}/sim/fault {{"name": "{scenario}"}} → armed={armed} (trigger {trigger})')
    if not armed:
        say.say("the simulator did not arm the fault")
        return 1
    fired: list[float] = []
    traffic = asyncio.create_task(_traffic(drill, sim_url, http, fired, say))
    watch = asyncio.create_task(_watch_fired(sim_url, scenario, http, fired, say))
    try:
        incidents = await _follow(daemon, name, injected, say)
    finally:
        for task in (traffic, watch):
            task.cancel()
        await asyncio.gather(traffic, watch, return_exceptions=True)
    server = await _until(lambda s: True, http, status_url, name)
    return _summary(incidents, server, fired[0] if fired else injected, bool(fired), say)


async def _until(
    pred: Callable[[dict[str, Any]], bool], http: aiohttp.ClientSession, url: str, name: str
) -> dict[str, Any]:
    """Poll `/status` until `pred` holds for the server (the caller bounds the time)."""
    while True:
        with contextlib.suppress(aiohttp.ClientError, TimeoutError, ValueError):
            async with http.get(url) as resp:
                body = await _json(resp)
            server = next((s for s in body["servers"] if s["name"] == name), None)
            if server is not None and pred(server):
                return dict(server)
        await asyncio.sleep(0.25)


async def _json(resp: aiohttp.ClientResponse, limit: int = 8 * 2**20) -> Any:
    """The JSON body, read to at most `limit` bytes (a larger one is an error)."""
    body = b""
    while len(body) <= limit and (chunk := await resp.content.read(limit + 1 - len(body))):
        body += chunk
    if len(body) > limit:
        raise ValueError(f"response body over {limit} bytes")
    return json.loads(body)


async def _traffic(
    drill: Drill, sim_url: str, http: aiohttp.ClientSession, fired: list[float], say: Narrator
) -> None:
    """Drive the trigger (sequential requests, concurrent streams, a long generation, client disconnects) until
    the fault fires; a request already in flight stays, as a user's would."""
    url = f"{sim_url}/v1/chat/completions"

    async def chat(max_tokens: int, stream: bool, hold_s: float | None = None) -> None:
        body = {
            "model": DEMO_MODEL,
            "messages": [{"role": "user", "content": "Write a long story about a lighthouse keeper."}],
            "max_tokens": max_tokens,
            "stream": stream,
        }
        with contextlib.suppress(aiohttp.ClientError, TimeoutError):
            async with http.post(url, json=body) as resp:
                deadline = time.monotonic() + hold_s if hold_s is not None else None
                async for _ in resp.content.iter_any():
                    if deadline is not None and time.monotonic() >= deadline:
                        return  # leaving the block closes the connection mid-stream: a client disconnect

    if drill.traffic == "requests":
        say.say(f"traffic: up to {drill.count} chat requests, one at a time")
        for _ in range(drill.count):
            if not fired:
                await chat(32, stream=False)
    elif drill.traffic == "long":
        say.say("traffic: one long generation (max_tokens 512)")
        await chat(512, stream=True)
    else:
        disconnect = drill.traffic == "disconnects"
        what = "streams cut after 0.3 s (client disconnects)" if disconnect else "concurrent streams"
        for round_ in range(1, 6):
            if fired:
                return
            say.say(f"traffic: {drill.count} {what} (round {round_})")
            tokens, hold = (2000, 0.3) if disconnect else (64, None)
            await asyncio.gather(*(chat(tokens, True, hold) for _ in range(drill.count)))
            await asyncio.sleep(2.0)


async def _watch_fired(
    sim_url: str, scenario: str, http: aiohttp.ClientSession, fired: list[float], say: Narrator
) -> None:
    """Note the moment the simulator reports the fault fired (stops when it does, or when the server dies)."""
    while True:
        try:
            async with http.get(f"{sim_url}/sim/state", timeout=aiohttp.ClientTimeout(total=2)) as resp:
                state = await _json(resp)
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return
        for fault in state.get("active", []):
            if fault.get("name") == scenario and fault.get("fired"):
                fired.append(float(fault.get("started_at") or time.time()))
                say.say(f"the fault fired in the simulator ({state.get('requests')} requests so far)")
                return
        await asyncio.sleep(0.2)


async def _follow(daemon: Daemon, name: str, since: float, say: Narrator) -> list[Incident]:
    """Follow the incident journal until an incident ends (serving again, alert only, or failed); all of them."""
    journal = IncidentJournal(Path(daemon.config.supervisor.state_dir) / "incidents.jsonl")
    seen: dict[str, Incident] = {}
    while True:
        for incident in await asyncio.to_thread(journal.load):
            if incident.server != name or incident.fault == "operator" or incident.detected_at < since - 1:
                continue
            before = seen.get(incident.id)
            if before != incident:
                _narrate(before, incident, say)
                seen[incident.id] = incident
        for incident in seen.values():
            if incident.action in ("alert", "failed") or incident.recovered_at is not None:
                return [*seen.values()]
        await asyncio.sleep(0.25)


def _narrate(before: Incident | None, now: Incident, say: Narrator) -> None:
    if before is None:
        say.say(f"incident {now.id}: fault {now.fault} → action {now.action} (rung before: {now.rung})")
        say.say(f"why: {now.reason}", indent=True)
        for key, value in now.evidence.items():
            if key not in ("log_tail", "release", "confidence") and value not in (None, [], {}, ""):
                say.say(f"evidence {key}: {json.dumps(value, default=str)[:140]}", indent=True)
    if now.forensics_path and (before is None or not before.forensics_path):
        bundle = Path(now.forensics_path)
        files = sorted(p.name for p in bundle.iterdir()) if bundle.is_dir() else []
        say.say(f"forensics bundle: {bundle}")
        say.say(f"files: {', '.join(files)}", indent=True)
        release = now.evidence.get("release") or {}
        if release:
            killed = ", ".join(f"{k['pid']} ({k['route']})" for k in release.get("killed", []))
            say.say(f"release: ok={release['ok']} steps {release['steps_s']}; killed {killed}", indent=True)
        flags = [*(f"+{f}" for f in now.flags_added), *(f"-{f}" for f in now.flags_removed)]
        say.say(f"relaunch flags: {' '.join(flags) or 'unchanged (configured argv)'}", indent=True)
    if now.action == "failed" and (before is None or before.action != "failed"):
        say.say(f"the supervisor gave up: {now.reason}")
    if now.recovered_at is not None and (before is None or before.recovered_at is None):
        say.say(f"recovered: serving again {now.time_to_serving_s or 0:.1f}s after detection")


def _summary(
    incidents: list[Incident], server: dict[str, Any], fired_at: float, fired_known: bool, say: Narrator
) -> int:
    """The figures of the drill; 0 when it ended in recovery (or in the alert of an alert-only fault)."""
    first, last = incidents[0], incidents[-1]
    since = "the fault fired" if fired_known else "injection"
    fallback = server.get("fallback") or {}
    flags = " ".join(fallback.get("flags") or []) or "none"
    say.say("summary")
    faults = " then ".join(i.fault for i in incidents)
    say.say(f"fault: {faults}   action: {last.action}   runbook: runbook.md#{first.fault}", indent=True)
    say.say(f"time to detect: {first.detected_at - fired_at:.1f}s after {since}", indent=True)
    say.say(
        f"state now: {server.get('state')}   rung: {fallback.get('rung', 0)}   flags: {flags}", indent=True
    )
    if last.forensics_path:
        say.say(f"forensics: {last.forensics_path}", indent=True)
    if last.action == "alert":
        say.say("alert only: the server keeps serving (degraded); nothing was restarted", indent=True)
        return 0
    if last.recovered_at is not None:
        say.say(f"time back to serving: {last.recovered_at - first.detected_at:.1f}s after detection", True)
        return 0
    say.say("not recovered: an operator would follow runbook.md#SglangServerFailed", indent=True)
    return 1


def _reap_leftovers(server: str, say: Narrator) -> None:
    """A backstop: anything of the drill's server still alive after the daemon stopped is killed and reported."""
    left = proctree.find_marked(server=server)
    if not left:
        say.say("nothing left running")
        return
    say.say(f"left behind after the daemon stopped (a supervisor bug): pids {[p.pid for p in left]}; killing")
    for ident in left:
        if proctree.still_same(ident):
            with contextlib.suppress(OSError):
                os.kill(ident.pid, signal.SIGKILL)
