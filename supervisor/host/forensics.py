"""Forensics first: before a fault kill, collect the evidence within a time budget, in parallel.

`state_dir/forensics/<incident>/`: one `stack-<title>.txt` per rank (py-spy; a wedged DP rank's listed first), `log-tail.txt`, `probes.json`
(last probe values incl. the metrics scrape), `gpus.json`, `argv-env.json` (secrets redacted), `summary.json`.
Retention is capped by count and bytes (oldest bundles go first).
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from policies.argv import redact
from probes.stacks import dump, py_spy_path
from supervisor.config import SupervisorConfig
from supervisor.records.incident import Incident
from supervisor.redaction import env_for_display, hide

log = structlog.get_logger()
BUDGET_S = 10.0
KEEP_BUNDLES = 50
KEEP_BYTES = 512 * 2**20
LOG_LINES = 500
TRACED_RETRY_S = 0.5


async def dump_stack(pid: int, timeout_s: float) -> str:
    """`py-spy dump --pid P` (the stacks probe's runner), bounded in time and size; the error text on failure.
    A rank another py-spy holds at that moment (the stacks probe's dump still running) cannot be suspended
    (EPERM): tried again once, `TRACED_RETRY_S` later, within the same budget."""
    tool = py_spy_path()
    if tool is None:
        return "py-spy not found"
    start = time.monotonic()
    text, error = await dump(tool, pid, timeout_s)
    left = timeout_s - (time.monotonic() - start) - TRACED_RETRY_S
    if not text and "Failed to suspend process" in error and left > 0:
        await asyncio.sleep(TRACED_RETRY_S)
        text, error = await dump(tool, pid, left)
    return text or f"py-spy dump of pid {pid} failed: {error}"


def _named_first(ranks: Mapping[int, str], dp_rank: object) -> dict[int, str]:
    """The ranks with those of the DP rank an incident names first (their stacks lead the bundle)."""
    if not isinstance(dp_rank, int):
        return dict(ranks)
    mine = re.compile(rf"_DP{dp_rank}(?:_|$)")
    return dict(sorted(ranks.items(), key=lambda item: not mine.search(item[1])))


def _safe(title: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", title)[:80] or "rank"


@dataclass(frozen=True)
class Evidence:
    """What the loop hands to forensics: data, plus one reader for the GPUs (it may fail or be slow)."""

    rank_pids: Mapping[int, str]  # pid -> process title, the ranks to dump
    log_tail: Sequence[str]
    probes: Mapping[str, Any]  # the monitor's last observation of each probe
    argv: Sequence[str]
    env: Mapping[str, str]
    gpus: Callable[[], Awaitable[list[dict[str, Any]]]]


async def capture(
    sup: SupervisorConfig, evidence: Evidence, incident: Incident, budget_s: float = BUDGET_S
) -> str:
    """Write the bundle for an incident; returns its path ('' when nothing could be written)."""
    root = Path(sup.state_dir) / "forensics"
    bundle = root / incident.id
    start = time.monotonic()
    try:
        bundle.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        log.error("forensics.failed", incident=incident.id, error=str(exc))
        return ""
    ranks = _named_first(evidence.rank_pids, incident.evidence.get("dp_rank"))
    stacks = await asyncio.gather(*(dump_stack(pid, budget_s) for pid in ranks))
    contents = {
        f"stack-{_safe(title)}.txt": f"# pid {pid} {title}\n{text}"
        for (pid, title), text in zip(ranks.items(), stacks, strict=True)
    }
    contents["log-tail.txt"] = "\n".join(hide(list(evidence.log_tail)[-LOG_LINES:])) + "\n"
    contents["probes.json"] = json.dumps(
        hide(json.loads(json.dumps(dict(evidence.probes), default=str))), indent=1
    )
    gpus: Any
    try:
        gpus = await asyncio.wait_for(evidence.gpus(), timeout=budget_s)
    except Exception as exc:  # a GPU backend failure is evidence too, never a reason to skip the kill
        gpus = {"error": str(exc)}
    contents["gpus.json"] = json.dumps(gpus, indent=1, default=str)
    contents["argv-env.json"] = json.dumps(
        {"argv": hide(redact(evidence.argv)), "env": env_for_display(evidence.env)}, indent=1
    )
    summary = {
        "incident": incident.id,
        "server": incident.server,
        "fault": incident.fault,
        "detected_at": incident.detected_at,
        "evidence": hide(incident.evidence),
        "files": list(contents),
        "ranks": {str(pid): title for pid, title in ranks.items()},
        "duration_s": round(time.monotonic() - start, 3),
    }
    contents["summary.json"] = json.dumps(summary, indent=1, default=str)
    try:  # a full or failing disk costs the bundle, never the recovery
        for name, text in contents.items():
            (bundle / name).write_text(text)
        prune(root)
    except OSError as exc:
        log.error("forensics.failed", incident=incident.id, error=str(exc))
        return ""
    log.info("recovery.forensics", incident=incident.id, path=str(bundle), duration_s=summary["duration_s"])
    return str(bundle)


def prune(root: Path, keep: int = KEEP_BUNDLES, max_bytes: int = KEEP_BYTES) -> list[Path]:
    """Drop the oldest bundles beyond `keep` or beyond `max_bytes` in all; returns what was removed."""
    bundles = sorted((p for p in root.iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime)
    sizes = {p: sum(f.stat().st_size for f in p.rglob("*") if f.is_file()) for p in bundles}
    removed: list[Path] = []
    total = sum(sizes.values())
    while bundles and (len(bundles) > keep or total > max_bytes):
        victim = bundles.pop(0)
        total -= sizes[victim]
        shutil.rmtree(victim, ignore_errors=True)
        removed.append(victim)
    return removed
