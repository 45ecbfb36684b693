"""The smallest action first: abort the requests of a server that is otherwise healthy, restart only when that
does not free it. Pure.

A decode whose pre-allocation queue stands (`pd_transfer_wedge`, tag `prealloc_blocked`) holds a request its KV
pool can never fit, and every later request queues behind it while `/health` stays 200 (real-pd.md §4b): SGLang
times it out only when the client gives up. Nothing of the decode is broken, so a restart (a model reload) is the
wrong cure. SGLang 0.5.23 names no request in that queue (no endpoint lists request ids), so the abort is
`POST /abort_request {"abort_all": true}`: every request on that decode is stuck behind the blocked one anyway.

The abort restarts the queue's stand (`ProgressTracker.restart_pd`). A queue seen shorter since, or a request's
token, means the abort freed it; what stands after is a new stand, aborted again. A stand still there a whole window
after an abort that freed nothing is aborted again too — SMG resends an aborted request (five tries by default), and
the resent long prompt blocks the queue again within a scrape — up to `MAX_ABORTS` in a row; after that the server
is restarted on its ladder (an abort SGLang takes without effect). Each abort is one incident with its alert.

A request stuck while the server serves the rest (`request_stuck`, `policies.stuck`) is aborted by its own id, the
others untouched; when that does not end it, the fault says so (`abort_ineffective`) and the server is restarted.
"""

from __future__ import annotations

from collections.abc import Mapping

from policies.model import Fault
from policies.plan import Plan

ABORT_TAGS = frozenset({"prealloc_blocked"})
MAX_ABORTS = 5  # aborts in a row that free nothing before a restart (SMG's default tries of one request)


def abort_first(fault: Fault, levels: Mapping[str, int]) -> Plan | None:
    """Abort the server's requests instead of restarting it, or None (plan a recovery as usual): only for a
    fault whose tags say the server itself is healthy, and not after `MAX_ABORTS` aborts in a row freed nothing;
    for a stuck request (`policies.stuck`), only those requests, until aborting them proved ineffective."""
    tags = {str(t) for t in fault.evidence.get("tags", ())}
    if fault.kind == "request_stuck":
        if "abort_ineffective" in tags or not fault.evidence.get("rids"):
            return None
        why = "abort the stuck request(s) by id (POST /abort_request rid); the server keeps serving the rest"
        return Plan("abort", why, levels=levels, page=False)
    if not tags & ABORT_TAGS or int(fault.evidence.get("progress", {}).get("pd_aborts") or 0) >= MAX_ABORTS:
        return None
    why = (
        "the decode's pre-allocation queue stands behind a request its KV pool cannot fit: abort the requests on "
        f"it (POST /abort_request abort_all), no restart; a restart only after {MAX_ABORTS} aborts in a row freed "
        "nothing"
    )
    return Plan("abort", why, levels=levels, page=False)
