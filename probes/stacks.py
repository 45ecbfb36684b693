"""Process-level evidence: which ranks live (from the tree view) and where each rank is blocked (py-spy).

On suspicion of a stall, `py-spy dump --pid P` runs for every rank in parallel within a budget. Each rank's
innermost collective-like frame is its *collective* (`all_reduce`, `broadcast`, `all_gather`, `custom_all_reduce`,
`recv_requests`, ...): ranks blocked in different collectives have diverged (failure-modes.md H1); all ranks in
one collective with no progress spin or wait on a peer that never comes.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from policies.model import Observation, RanksValues, StacksValues, TreeView

# Checked in order against each frame's function name; the first token found names the collective.
COLLECTIVES = (
    "custom_all_reduce",
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "all_to_all",
    "broadcast",
    "barrier",
    "recv_requests",
    "synchronize",
)
IDLE = "recv_requests"
PAUSED = "paused"
PD_POLL = "pd_poll"
# Frames that say where a scheduler is, whatever it calls inside them: SGLang's paused event loop
# (`_record_scheduler_state_for_paused_engine`), and the request intake, whose broadcast of new requests across
# the TP ranks runs every iteration even at tp 1 and waits for no peer's forward (rl-pause.md: a paused
# scheduler caught there was read as a blocking collective), and a PD worker's poll of its KV transfers, whose
# all-reduce of the poll states runs every iteration too (real-pd.md: a decode waiting for a stopped prefill's KV
# was caught there and read as a collective hang).
CONTEXT = (
    ("_record_scheduler_state_for_paused_engine", PAUSED),
    ("ingest_requests", IDLE),
    ("recv_requests", IDLE),
    ("_broadcast_reqs_across_ranks", IDLE),
    *((name, PD_POLL) for name in ("poll_and_all_reduce", "poll_and_all_reduce_attn_cp_tp_group")),
    *((name, PD_POLL) for name in ("poll_and_all_reduce_with_staging", "poll_and_all_reduce_prefill_pp")),
)
# /proc state letters of a process that runs nothing until resumed: stopped (SIGSTOP), uninterruptible sleep.
# `t` (traced) is left out: py-spy stops a rank for a moment while it reads its stack.
FROZEN_STATES = frozenset({"T", "D"})
_OUTPUT_LIMIT = 256 * 1024
_FRAME = re.compile(r"^\s+(\S.*?) \((.*)\)\s*$")
_THREAD = re.compile(r"^Thread (\d+)")


def py_spy_path() -> str | None:
    """py-spy next to the running interpreter (the venv), else on PATH."""
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.exists() else shutil.which("py-spy")


def parse_dump(text: str) -> list[list[str]]:
    """The threads of a `py-spy dump`, each a list of `function (file:line)` frames, innermost first.

    The thread named MainThread (or, when names are absent, the first thread) comes first.
    """
    threads: list[tuple[bool, list[str]]] = []
    for line in text.splitlines():
        if _THREAD.match(line):
            threads.append(("MainThread" in line, []))
            continue
        match = _FRAME.match(line)
        if match and threads:
            threads[-1][1].append(f"{match.group(1)} ({match.group(2)})")
    threads.sort(key=lambda t: not t[0])
    return [frames for _, frames in threads]


def classify(frames: list[str]) -> tuple[str | None, str | None]:
    """(collective, the frame it was found in): `paused` or `recv_requests` when a frame of the stack is the
    paused event loop or the request intake (`CONTEXT`), else the innermost collective-like frame."""
    for marker, name in CONTEXT:
        for frame in frames:
            if frame.split(" (", 1)[0] == marker:
                return name, frame
    for frame in frames:
        function = frame.split(" (", 1)[0]
        for token in COLLECTIVES:
            if token in function:
                return token, frame
    return None, None


async def dump(py_spy: str, pid: int, timeout_s: float) -> tuple[str, str]:
    """(stdout, error) of one `py-spy dump`; the process is killed when the budget runs out."""
    try:
        proc = await asyncio.create_subprocess_exec(
            py_spy, "dump", "--pid", str(pid), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
    except OSError as exc:
        return "", f"py-spy could not run: {exc}"
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout_s)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
        return "", f"py-spy took longer than {timeout_s:g}s"
    if proc.returncode != 0:
        return "", err[:400].decode("utf-8", "replace").strip() or f"py-spy exit {proc.returncode}"
    return out[:_OUTPUT_LIMIT].decode("utf-8", "replace"), ""


async def probe_stacks(pids: dict[int, str], budget_s: float) -> Observation:
    """Dump every rank in parallel and say whether the ranks diverged (probe `stacks`)."""
    start = time.monotonic()
    tool = py_spy_path()
    if tool is None or not pids:
        reason = "py-spy not found" if tool is None else "no rank pids"
        return Observation("stacks", time.monotonic(), False, reason, 0.0, {"ranks": {}, "error": reason})
    results = await asyncio.gather(*(dump(tool, pid, budget_s) for pid in pids))
    ranks: dict[str, dict[str, Any]] = {}
    for (pid, title), (text, error) in zip(pids.items(), results, strict=True):
        threads = parse_dump(text) if text else []
        main = threads[0] if threads else []
        collective, frame = classify(main)
        ranks[title or str(pid)] = {
            "pid": pid,
            "collective": collective,
            "frame": frame or (main[0] if main else None),
            "stack": main[:12],
            "error": error or None,
        }
    # the detokenizer and tokenizer never join a collective: only scheduler ranks say where TP is blocked
    schedulers = {t: r for t, r in ranks.items() if "scheduler" in t} or ranks
    seen = {r["collective"] for r in schedulers.values() if r["collective"]}
    dumped = [r for r in schedulers.values() if not r["error"]]
    diverging = len(seen) > 1
    all_in = next(iter(seen)) if len(seen) == 1 and all(r["collective"] for r in dumped) and dumped else None
    end = time.monotonic()
    if diverging:
        detail = "ranks diverged: " + ", ".join(f"{t}={r['collective']}" for t, r in sorted(ranks.items()))
    elif all_in:
        unreadable = len(schedulers) - len(dumped)
        detail = f"all {len(dumped)} readable ranks in {all_in}" + (
            f", {unreadable} unreadable" if unreadable else ""
        )
    else:
        detail = f"{len(dumped)}/{len(ranks)} ranks dumped, no common collective"
    values: StacksValues = {
        "ranks": ranks,
        "diverging": diverging,
        "all_in": all_in,
        "collectives": sorted(seen),
    }
    return Observation("stacks", end, bool(dumped), detail, end - start, values)


def observe_ranks(tree: TreeView, previous_cpu: dict[str, float], now: float) -> Observation:
    """Every expected rank alive and not a zombie, with per-rank CPU time advancing or not and the ranks frozen
    (stopped or in uninterruptible sleep, no CPU time since the previous reading) (probe `ranks`)."""
    cpu = dict(tree.rank_cpu_s)
    advancing = {t: cpu[t] > previous_cpu[t] for t in cpu if t in previous_cpu}
    states = dict(tree.rank_states)
    frozen = sorted(t for t, s in states.items() if s in FROZEN_STATES and advancing.get(t) is False)
    missing, zombie = list(tree.missing_ranks), list(tree.zombie_ranks)
    ok = tree.main_alive and not missing and not zombie
    if not tree.main_alive:
        detail = "main process gone"
    elif missing or zombie:
        detail = f"ranks lost: missing {missing}, zombie {zombie}"
    else:
        detail = f"{len(cpu)} ranks alive"
    values: RanksValues = {
        "main_alive": tree.main_alive,
        "missing": missing,
        "zombie": zombie,
        "cpu_s": {t: round(v, 2) for t, v in cpu.items()},
        "cpu_advancing": advancing,
        "states": states,
        "frozen": frozen,
    }
    if ok and frozen:
        detail += f", frozen: {', '.join(f'{t}={states[t]}' for t in frozen)}"
    return Observation("ranks", now, ok, detail, 0.0, values)
