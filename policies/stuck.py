"""One request stuck while the server serves everyone else: abort it, not the server. Pure.

A request in flight far longer than its peers and than its `max_tokens` allows, on a server that keeps producing
tokens and finishing other requests (sglang PR #33920), is not a wedge: a restart would reload the model for one
request. From SGLang's request log (probes/requests.py) a request is stuck when it has been in flight at least
`stuck_request_min_s`, `stuck_request_factor` times the p99 latency of the requests that finished lately, and as
many times what its `max_new_tokens` takes at their p99 time per token; `MIN_PEERS` requests finished since it came;
and the server made progress within `stall_after_s`. That is a `request_stuck` naming its request ids: the plan
aborts them (`POST /abort_request {"rid": …}`, policies.abort), nothing else.

Why that is safe: the id is SGLang's own, read from the `request.received` line of that very request, and SGLang
aborts only the request it names (an unknown id is answered 200 and ignored); the request is already past what any
answer of its length takes on this server. An abort SGLang takes ends the request with a `request.finished` line
(finish reason `abort`). A request still in flight `ABORT_GRACE_S` after its abort, or `MAX_ABORTS` requests
aborted in one launch (slots leaking faster than aborts free them, sglang #31800), is no longer the smallest
action's to cure: the fault is tagged `abort_ineffective` and the server restarted (same flags).
"""

from __future__ import annotations

from policies.model import (
    Fault,
    ProbeSettings,
    StuckCandidate,
    make_fault,
    progress_values,
    requests_values,
)
from policies.window import Window

MIN_PEERS = 10  # requests finished since a stuck one came: the server serves the others
ABORT_GRACE_S = 30.0  # an abort SGLang takes ends the request at once; this long after, it did not
MAX_ABORTS = 10  # requests aborted in one launch before a restart is the cure


def bound_s(req: StuckCandidate, v_p99: float | None, per_token: float | None, s: ProbeSettings) -> float:
    """How long `req` may be in flight before it counts as stuck."""
    bounds = [s.stuck_request_min_s]
    if v_p99:
        bounds.append(s.stuck_request_factor * v_p99)
    if per_token and req.get("max_new_tokens"):
        bounds.append(s.stuck_request_factor * per_token * float(req.get("max_new_tokens") or 0))
    return max(bounds)


def stuck_request(w: Window, s: ProbeSettings) -> Fault | None:
    """`request_stuck` naming the stuck requests (tag `abort_ineffective` when aborting them did not help), or
    None."""
    obs, progress = w.latest("requests"), w.latest("progress")
    if obs is None or progress is None:
        return None
    moved_at = progress_values(progress).get("last_progress_at")
    if moved_at is None or obs.at - moved_at > s.stall_after_s:
        return None  # the server itself stands: the stall rules judge it
    v = requests_values(obs)
    p99, per_token = v.get("p99_e2e_s"), v.get("p99_per_token_s")
    stuck = [
        r
        for r in v.get("oldest", ())
        if r.get("age_s", 0.0) >= bound_s(r, p99, per_token, s) and r.get("finished_since", 0) >= MIN_PEERS
    ]
    if not stuck:
        return None
    aborted = [r for r in stuck if r.get("aborted_s") is not None]
    failed = [r for r in aborted if float(r.get("aborted_s") or 0.0) >= ABORT_GRACE_S]
    leak = int(v.get("aborts") or 0) >= MAX_ABORTS
    if aborted and not failed and not leak:
        return None  # its abort is on its way
    ages = ", ".join(f"{r.get('rid')} {float(r.get('age_s', 0.0)):.0f}s" for r in stuck)
    peers = f"p99 {p99:.1f}s" if p99 else "no finished peers' latency"
    reason = (
        f"{len(stuck)} request(s) in flight far past their peers ({peers}) while the server serves: {ages}"
    )
    tags = ["request_stuck"]
    if failed:
        reason += f"; still in flight {ABORT_GRACE_S:.0f}s after its abort"
        tags.append("abort_ineffective")
    elif leak:
        reason += f"; {v.get('aborts')} requests aborted in this launch already"
        tags.append("abort_ineffective")
    return make_fault(
        "request_stuck",
        reason,
        0.8,
        rids=[str(r.get("rid")) for r in stuck if r.get("aborted_s") is None or failed or leak],
        requests={
            "oldest": list(stuck),
            "p99_e2e_s": p99,
            "p99_per_token_s": per_token,
            "aborts": v.get("aborts"),
        },
        tags=tags,
    )
