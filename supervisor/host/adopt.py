"""What the host shows of a run a previous daemon left: is it the same process, whole, alone on its GPUs, and
does its own `/server_info` agree with the config? (supervisor.loop.adoption decides; this only looks.)"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from supervisor.config import ServerConfig
from supervisor.host import identity, launcher, proctree
from supervisor.host.gpu import device_holders
from supervisor.redaction import server_api_key

INFO_TIMEOUT_S = 3.0
INFO_LIMIT = 1 << 20


@dataclass(frozen=True)
class AdoptionView:
    """The found run's tree, the holders of its GPUs that are not of it, and what `/server_info` says."""

    missing_ranks: tuple[str, ...] = ()
    foreign_holders: tuple[str, ...] = ()
    server_info_problem: str | None = None


def attach(
    ident: dict[str, Any], marker: str, run_id: str, log_path: str, offset: int | None
) -> launcher.Launched | str:
    """Re-attach to a recorded run: the same boot, pid, start time and run marker, its log tailed from `offset`
    (None: from the end of the file, what was written while no daemon watched is not replayed); else why not."""
    try:
        recorded = identity.RunIdentity.from_json(ident)
    except (KeyError, TypeError, ValueError) as exc:
        return f"the recorded identity is unreadable ({exc!r})"
    problem = recorded.matches_live()
    if problem is not None:
        return problem
    markers = proctree.read_markers(recorded.pid)
    if markers.get(proctree.RUN_MARKER) != run_id or markers.get(proctree.SERVER_MARKER) != marker:
        return f"pid {recorded.pid} does not carry run {run_id} of {marker} in its environment"
    path = Path(log_path)
    start = offset if offset is not None else (path.stat().st_size if path.exists() else 0)
    attached = launcher.attach(recorded.pid, recorded.pgid, path, start, start_ticks=recorded.start_ticks)
    return attached if isinstance(attached, launcher.Launched) else f"cannot re-attach: {attached.reason}"


def view(cfg: ServerConfig, pid: int, run_id: str, marker: str, titles: list[str]) -> AdoptionView:
    """Look at a found run: missing ranks, foreign holders of its GPUs, `/server_info` against the config."""
    snap = proctree.snapshot(pid, run_id, titles)
    missing = tuple(r.title for r in snap.ranks if r.status != "running")
    foreign = tuple(
        f"pid {h.pid} ({h.name}, {h.whose}) holds {h.path}"
        for h in device_holders(cfg.device_paths, use_fuser=False)
        if proctree.read_markers(h.pid).get(proctree.SERVER_MARKER) != marker
    )
    return AdoptionView(missing, foreign, _server_info_problem(cfg))


def _server_info_problem(cfg: ServerConfig) -> str | None:
    """The model and tp size the server reports against the config's; None when they agree or it does not
    answer yet (the health budget of the adopted run judges silence)."""
    key = server_api_key(cfg)
    request = urllib.request.Request(
        cfg.base_url + "/server_info", headers={"Authorization": f"Bearer {key}"} if key else {}
    )
    try:
        with urllib.request.urlopen(request, timeout=INFO_TIMEOUT_S) as resp:
            info = json.loads(resp.read(INFO_LIMIT))
    except (OSError, ValueError, urllib.error.URLError):
        return None
    if not isinstance(info, dict):
        return None
    wrong = []
    if cfg.model_path and info.get("model_path") not in (None, cfg.model_path):
        wrong.append(f"model_path {info.get('model_path')!r} (config: {cfg.model_path!r})")
    if info.get("tp_size") not in (None, cfg.tp_size):
        wrong.append(f"tp_size {info.get('tp_size')!r} (config: {cfg.tp_size})")
    return f"/server_info disagrees with the config: {', '.join(wrong)}" if wrong else None
