"""Know the process tree of one SGLang launch: group, descendants, environment marker, rank titles.

Every process the launcher starts carries ``SGLSUP_RUN_ID=<run>`` and ``SGLSUP_SERVER=<server>`` in its
environment; children inherit it, so a rank that was re-parented to PID 1 or called ``setsid`` is still
found by reading ``/proc/<pid>/environ``. Nothing here signals anything.

Finding descendants and marked processes reads every process on the host, so a snapshot does it at most every
``FULL_SCAN_S``: in between, while every expected rank still shows its title at the PID last seen, only those
PIDs and the main process are read (``/proc/<pid>/stat`` each: state, CPU time, start time — a PID whose start
time changed is another process). Any rank not found at its PID forces a full scan at once, so a loss is
reported as soon as without this shortcut (the reaper rescans the host itself before it acts).
"""

from __future__ import annotations

import hashlib
import os
import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

RUN_MARKER = "SGLSUP_RUN_ID"
SERVER_MARKER = "SGLSUP_SERVER"


def server_marker(name: str, state_dir: str | Path) -> str:
    """The value of `SGLSUP_SERVER` for a server: its name and its deployment (the resolved state dir), so two
    daemons on one host (or a test and a benchmark) never take each other's servers of the same name."""
    return f"{name}@{hashlib.sha1(str(Path(state_dir).resolve()).encode()).hexdigest()[:10]}"


_PROC = Path("/proc")
_ENVIRON_LIMIT = 4 * 1024 * 1024
_TITLE_LIMIT = 4096
# Title parts that do not identify a rank slot for our purposes (EP, attention CP, MoE DP).
_EXTRA_PARTS = re.compile(r"_(?:ATTN_CP|MOE_DP|EP)\d+")
# Never signalled, never counted as a holder: NVIDIA's daemons. A trailing "*" matches a prefix.
DEFAULT_ALLOWLIST: tuple[str, ...] = ("nvidia-persistenced", "nv-hostengine", "dcgm*")
FULL_SCAN_S = 60.0
_CLK_TCK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class ProcId:
    """A PID plus its start time, so a reused PID is never mistaken for ours."""

    pid: int
    create_time: float


@dataclass(frozen=True)
class RankState:
    """One expected title: the PID holding it, and whether it runs, is a zombie, or is missing."""

    title: str
    pid: int | None
    status: str  # "running" | "zombie" | "missing"
    cpu_time_s: float | None
    start_ticks: int | None = None  # the process's start time in clock ticks since boot (its identity)
    state: str | None = None  # the state letter of /proc/<pid>/stat: R, S, D, T (stopped), t (traced), ...


@dataclass(frozen=True)
class TreeSnapshot:
    """What the tree of one run looks like at ``taken_at`` (monotonic seconds)."""

    taken_at: float
    main_pid: int
    main_alive: bool
    ranks: tuple[RankState, ...]
    descendants: tuple[ProcId, ...]
    marked: tuple[ProcId, ...]
    scanned_at: float = 0.0  # monotonic: the last full scan of the host's processes

    @property
    def lost_ranks(self) -> tuple[RankState, ...]:
        """Expected ranks that are missing or zombies."""
        return tuple(r for r in self.ranks if r.status != "running")

    @property
    def crashed(self) -> bool:
        """Main alive but a rank gone: SGLang's own watchdog may not notice (failure F10)."""
        return self.main_alive and bool(self.lost_ranks)


@dataclass(frozen=True)
class TreeEvent:
    """A change between two snapshots: ``main_exited`` or ``rank_lost`` (with the title)."""

    kind: str
    pid: int
    title: str = ""


def expected_rank_titles(
    tp: int, dp: int = 1, pp: int = 1, nnodes: int = 1, node_rank: int = 0, dp_attention: bool = False
) -> list[str]:
    """Process titles SGLang gives its schedulers, detokenizer and DP controller for this layout.

    A server spread over `nnodes` nodes runs TP ranks `node_rank·tp/nnodes …` here, and its detokenizer on
    node 0 only. With DP attention the DP ranks split the TP group: TP rank `t` is attention-DP rank
    `t // (tp / dp)` (`scheduler_DP0_TP0`, `scheduler_DP1_TP1` at tp 2, dp 2), `tp` schedulers in all.
    """
    titles: list[str] = []
    per_node = max(1, tp // max(1, nnodes))
    local = range(node_rank * per_node, (node_rank + 1) * per_node) if nnodes > 1 else range(tp)
    for d in range(1 if dp_attention else dp):
        for p in range(pp):
            for t in local:
                shown = t // max(1, tp // dp) if dp_attention else d
                parts = [f"DP{shown}"] if dp > 1 else []
                parts += [f"PP{p}"] if pp > 1 else []
                parts += [f"TP{t}"] if tp > 1 else []
                titles.append("_".join(["sglang::scheduler", *parts]))
    if node_rank == 0:
        titles.append("sglang::detokenizer")
    if dp > 1:
        titles.append("sglang::data_parallel_controller")
    return titles


def process_title(pid: int) -> str:
    """The title a process shows (``setproctitle`` rewrites cmdline); empty if unreadable."""
    try:
        with open(f"{_PROC}/{pid}/cmdline", "rb") as fh:
            raw = fh.read(_TITLE_LIMIT)
    except OSError:
        return ""
    return raw.split(b"\0", 1)[0].decode("utf-8", "replace").strip()


def display_name(pid: int) -> str:
    """A process's SGLang title when it has one, else its name ("?" when gone)."""
    title = process_title(pid)
    if title.startswith("sglang::"):
        return title
    try:
        return psutil.Process(pid).name()
    except psutil.Error:
        return "?"


def _canonical_title(title: str) -> str:
    return _EXTRA_PARTS.sub("", title)


def is_alive(pid: int) -> bool:
    """True if the PID exists and is not a zombie (a zombie holds no files and no GPU memory)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def proc_id(pid: int) -> ProcId | None:
    """The PID with its start time, or None if it is gone."""
    try:
        return ProcId(pid, psutil.Process(pid).create_time())
    except psutil.Error:
        return None


def still_same(ident: ProcId) -> bool:
    """True if ``ident.pid`` is still the very process recorded (same start time) and alive."""
    current = proc_id(ident.pid)
    return current is not None and abs(current.create_time - ident.create_time) < 0.01 and is_alive(ident.pid)


def is_protected(pid: int, allowlist: Sequence[str] = DEFAULT_ALLOWLIST) -> bool:
    """True for ourselves, our ancestors, and processes whose name matches the allowlist."""
    me = psutil.Process()
    if pid == me.pid or pid in {p.pid for p in me.parents()}:
        return True
    try:
        proc = psutil.Process(pid)
        names = {proc.name(), os.path.basename(process_title(pid).split(" ", 1)[0])}
    except psutil.Error:
        return False
    for pattern in allowlist:
        if pattern.endswith("*"):
            if any(n.startswith(pattern[:-1]) for n in names):
                return True
        elif pattern in names:
            return True
    return False


def group_members(pgid: int) -> list[int]:
    """Live PIDs whose process group is ``pgid``."""
    found = []
    for pid in all_pids():
        try:
            if os.getpgid(pid) == pgid and is_alive(pid):
                found.append(pid)
        except OSError:
            continue
    return found


def descendants(pid: int) -> list[ProcId]:
    """Every live descendant of ``pid`` (children of children included)."""
    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []
    found = []
    for child in children:
        try:
            if child.status() != psutil.STATUS_ZOMBIE:
                found.append(ProcId(child.pid, child.create_time()))
        except psutil.Error:
            continue
    return found


def read_markers(pid: int) -> dict[str, str]:
    """``SGLSUP_RUN_ID`` / ``SGLSUP_SERVER`` from a process's initial environment (empty if none)."""
    try:
        with open(f"{_PROC}/{pid}/environ", "rb") as fh:
            raw = fh.read(_ENVIRON_LIMIT)
    except OSError:
        return {}
    found = {}
    for entry in raw.split(b"\0"):
        key, sep, value = entry.partition(b"=")
        if sep and key in (RUN_MARKER.encode(), SERVER_MARKER.encode()):
            found[key.decode()] = value.decode("utf-8", "replace")
    return found


def find_marked(run_id: str | None = None, server: str | None = None) -> list[ProcId]:
    """Live processes whose environment carries this run (or, with ``server`` only, any run of it)."""
    if run_id is None and server is None:
        return []
    me = os.getpid()
    found = []
    for pid in all_pids():
        if pid == me:
            continue
        markers = read_markers(pid)
        if run_id is not None and markers.get(RUN_MARKER) != run_id:
            continue
        if server is not None and markers.get(SERVER_MARKER) != server:
            continue
        ident = proc_id(pid)
        if ident is not None and is_alive(pid):
            found.append(ident)
    return found


def snapshot(
    main_pid: int, run_id: str, expected_titles: Sequence[str] = (), previous: TreeSnapshot | None = None
) -> TreeSnapshot:
    """Main alive?, each expected title → PID / missing / zombie, all descendants, marked processes.

    A zombie shows no title any more; ``previous`` lets a rank seen before be reported as a zombie.
    """
    quick = quick_snapshot(main_pid, expected_titles, previous)
    if quick is not None:
        return quick
    desc = descendants(main_pid)
    marked = find_marked(run_id=run_id) if run_id else []
    by_title = _index_titles({p.pid for p in desc} | {p.pid for p in marked})
    known = {r.title: r.pid for r in previous.ranks} if previous else {}
    ranks = tuple(
        _rank_state(title, by_title.get(_canonical_title(title)), known.get(title))
        for title in expected_titles
    )
    now = time.monotonic()
    return TreeSnapshot(
        taken_at=now,
        main_pid=main_pid,
        main_alive=is_alive(main_pid),
        ranks=ranks,
        descendants=tuple(desc),
        marked=tuple(marked),
        scanned_at=now,
    )


def quick_snapshot(
    main_pid: int, expected_titles: Sequence[str], previous: TreeSnapshot | None
) -> TreeSnapshot | None:
    """The snapshot from the PIDs seen last time, or None when a full scan is due (see the module doc).

    A few small reads of ``/proc`` (one per known rank): cheap enough to run on the event loop.
    """
    now = time.monotonic()
    if previous is None or previous.main_pid != main_pid or now - previous.scanned_at >= FULL_SCAN_S:
        return None
    known = {r.title: r for r in previous.ranks if r.status == "running" and r.pid is not None}
    ranks = []
    for title in expected_titles:
        seen = known.get(title)
        stat = _stat(seen.pid) if seen is not None and seen.pid is not None else None
        if seen is None or stat is None or stat[0] == "Z" or stat[2] != seen.start_ticks:
            return None
        ranks.append(RankState(title, seen.pid, "running", stat[1], stat[2], stat[0]))
    main = _stat(main_pid)
    if main is None or main[0] == "Z":
        return None
    return TreeSnapshot(
        taken_at=now,
        main_pid=main_pid,
        main_alive=True,
        ranks=tuple(ranks),
        descendants=previous.descendants,  # as of the last full scan; the reaper rechecks each one
        marked=previous.marked,
        scanned_at=previous.scanned_at,
    )


def changes(previous: TreeSnapshot | None, current: TreeSnapshot) -> list[TreeEvent]:
    """Events between two snapshots; with no previous one, everything already lost counts."""
    events: list[TreeEvent] = []
    if not current.main_alive and (previous is None or previous.main_alive):
        events.append(TreeEvent("main_exited", current.main_pid))
    before = {r.title: r.status for r in previous.ranks} if previous else {}
    for rank in current.lost_ranks:
        if before.get(rank.title, "running") == "running":
            events.append(TreeEvent("rank_lost", rank.pid or 0, rank.title))
    return events


def poll_tree(
    previous: TreeSnapshot | None, main_pid: int, run_id: str, expected_titles: Sequence[str] = ()
) -> tuple[TreeSnapshot, list[TreeEvent]]:
    """Take a snapshot and say what changed; the daemon calls this every ≤ 0.5 s."""
    current = snapshot(main_pid, run_id, expected_titles, previous)
    return current, changes(previous, current)


def start_ticks(pid: int) -> int | None:
    """A live process's start time in clock ticks since boot (``/proc/<pid>/stat`` field 22): with the boot id,
    what tells this process from a later one given the same PID. None if the PID is gone or a zombie."""
    stat = _stat(pid)
    return None if stat is None or stat[0] in ("Z", "X") else stat[2]


def _stat(pid: int) -> tuple[str, float, int] | None:
    """(state letter, user + system CPU seconds, start time in ticks) from ``/proc/<pid>/stat``; None if gone."""
    try:
        with open(f"{_PROC}/{pid}/stat", "rb") as fh:
            raw = fh.read(_TITLE_LIMIT)
    except OSError:
        return None
    fields = raw[raw.rfind(b")") + 2 :].split()  # after "pid (comm) ": the comm may hold spaces
    try:
        return fields[0].decode(), (int(fields[11]) + int(fields[12])) / _CLK_TCK, int(fields[19])
    except (IndexError, ValueError):
        return None


def _rank_state(title: str, pid: int | None, known_pid: int | None) -> RankState:
    if pid is None:
        if known_pid is not None and _is_zombie(known_pid):
            return RankState(title, known_pid, "zombie", None)
        return RankState(title, None, "missing", None)
    stat = _stat(pid)
    if stat is None:
        return RankState(title, None, "missing", None)
    return RankState(title, pid, "running", stat[1], stat[2], stat[0])


def _is_zombie(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _index_titles(pids: Iterable[int]) -> dict[str, int]:
    index: dict[str, int] = {}
    for pid in sorted(pids):
        title = process_title(pid)
        if title.startswith("sglang::"):
            index.setdefault(_canonical_title(title), pid)
    return index


def all_pids() -> list[int]:
    """Every PID currently listed in /proc."""
    try:
        return [int(name) for name in os.listdir(_PROC) if name.isdigit()]
    except OSError:
        return []
