"""One DP rank wedged while its peers serve (`--dp-size N`).

The summed counters keep moving (the other ranks decode), so the whole-server lease sees progress while every
request routed to the stuck rank — 1/N of the gateway's and the canary's — waits forever. Each rank's scheduler
writes its `/v1/loads` snapshot every loop iteration, at least once a second even idle (probes/loads.py), so a
rank whose snapshot is `rank_stall_after_s` older than a peer's has not turned its loop for that long while the
peer's turned: stopped, spinning in a kernel, or blocked in its TP group's collective. A rank that is slow but
moving writes a snapshot after every batch and never lags that far.

That is a wedge of the server (`decode_wedge`, tag `dp_rank_wedged`) with the rank named: the server is restarted
on its ladder, as for a whole-server wedge, since SGLang cannot restart one DP rank. When every rank stands still
none lags: the whole-server rules judge it.
"""

from __future__ import annotations

from policies.model import Fault, ProbeSettings, dp_values, make_fault
from policies.window import Window


def dp_rank_wedge(w: Window, settings: ProbeSettings) -> Fault | None:
    """The DP rank lagging its peers by `rank_stall_after_s` or more in the newest `dp` reading (the most lagging
    one when several do), or None."""
    dp = w.latest("dp")
    ranks = dp_values(dp).get("ranks", {}) if dp is not None and dp.ok else {}
    if len(ranks) < 2:
        return None
    lags = {rank: float(v.get("lag_s", 0.0)) for rank, v in ranks.items()}
    stuck = [r for r, lag in lags.items() if lag >= settings.rank_stall_after_s]
    moving = sorted(r for r, lag in lags.items() if lag < settings.rank_stall_after_s)
    if not stuck or not moving or dp is None:
        return None
    rank = max(stuck, key=lambda r: lags[r])
    mine = ranks[rank]
    held = f"{mine.get('running', 0):.0f} running, {mine.get('waiting', 0):.0f} waiting"
    peers = ", ".join(f"DP{r}" for r in moving)
    reason = (
        f"DP rank {rank} made no progress for {lags[rank]:.1f}s ({held} as of its last snapshot) while {peers} "
        f"{'serves' if len(moving) == 1 else 'serve'}"
    )
    return make_fault(
        "decode_wedge",
        reason,
        0.9,
        onset=dp.at - lags[rank],
        dp_rank=int(rank),
        dp={"ranks": {r: dict(v) for r, v in ranks.items()}, "stuck": sorted(stuck, key=int)},
        tags=["dp_rank_wedged"],
    )
