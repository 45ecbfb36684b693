"""The smallest action first: abort the requests of a server that is otherwise healthy, restart only when that
does not free it. Pure.

A decode whose pre-allocation queue stands (`pd_transfer_wedge`, tag `prealloc_blocked`) holds a request its KV
pool can never fit, and every later request queues behind it while `/health` stays 200 (real-pd.md §4b): SGLang
times it out only when the client gives up. Nothing of the decode is broken, so a restart (a model reload) is the
wrong cure. SGLang 0.5.23 names no request in that queue (no endpoint lists request ids), so the abort is
`POST /abort_request {"abort_all": true}`: every request on that decode is stuck behind the blocked one anyway.

The abort restarts the queue's stand (`ProgressTracker.restart_pd`): the same stand seen a whole window later
(the queue never got shorter: the abort freed nothing) restarts the server on its ladder. A queue that got shorter
and stands again — a client, or a gateway's retry, sending the long prompt again — is a new stand: aborted again,
one incident each.
"""

from __future__ import annotations

from collections.abc import Mapping

from policies.model import Fault
from policies.plan import Plan

ABORT_TAGS = frozenset({"prealloc_blocked"})


def abort_first(fault: Fault, levels: Mapping[str, int]) -> Plan | None:
    """Abort the server's requests instead of restarting it, or None (plan a recovery as usual): only for a
    fault whose tags say the server itself is healthy, and not for the stand an abort already restarted."""
    tags = {str(t) for t in fault.evidence.get("tags", ())}
    if not tags & ABORT_TAGS or fault.evidence.get("progress", {}).get("pd_restarted"):
        return None
    why = (
        "the decode's pre-allocation queue stands behind a request its KV pool cannot fit: abort the requests on "
        "it (POST /abort_request abort_all), no restart; a restart follows only if the same stand is still there "
        "a window later"
    )
    return Plan("abort", why, levels=levels, page=False)
