"""Gateway membership: which of this daemon's servers belong in SGLang's gateway now, and the calls that get it
there (pure).

A server is a worker of its gateway only while it is proven — the readiness verdict: `serving`, its canary
passed, its engine not paused by a client — so it leaves the moment a fault is decided (the loop leaves
`serving` before any forensics), a relaunch joins only once its canary passed, and a planned stop leaves first.
An adopted run with no verdict yet is left as the gateway has it (a daemon's own restart changes nothing there),
and a router is never a worker. Only the URLs this daemon owns are ever touched: one gateway serves many hosts.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

GONE = frozenset({"draining"})  # SMG keeps a removed worker 5 s as `draining`: it takes no new requests


@dataclass(frozen=True)
class Want:
    """One server of this daemon as its gateway should have it."""

    server: str
    url: str  # what the gateway reaches it by (`advertise_url`)
    member: bool | None  # None: no verdict yet (an adopted run), or never a worker (a router): leave as it is
    worker_type: str = "regular"  # regular | prefill | decode
    bootstrap_port: int | None = None  # a prefill's


@dataclass(frozen=True)
class Listed:
    """One worker as `GET /workers` lists it."""

    id: str
    url: str
    status: str = ""  # SMG: pending | ready | not_ready | failed | draining; the router: ""
    healthy: bool = True
    model: str = ""


@dataclass(frozen=True)
class Call:
    """One call to make: `add` a server's URL, or `remove` the worker `id`."""

    op: str  # add | remove
    server: str
    url: str
    id: str = ""
    worker_type: str = "regular"
    bootstrap_port: int | None = None


def member_of(
    role: str, state: str, proven: bool, engine_paused: bool, adopted_unjudged: bool
) -> bool | None:
    """Whether a server belongs in the gateway now (None: leave it as the gateway has it) — None for a router,
    for a run adopted but not yet judged, and for `stopped` (a daemon starting has judged nothing yet; a stop it
    made itself left the gateway while `stopping`)."""
    if role == "router" or adopted_unjudged or state == "stopped":
        return None
    return state == "serving" and proven and not engine_paused


def calls(wants: Iterable[Want], listed: Iterable[Listed]) -> list[Call]:
    """The calls that make the gateway hold exactly the wanted members among this daemon's URLs."""
    present: dict[str, list[Listed]] = {}
    for worker in listed:
        present.setdefault(worker.url.rstrip("/"), []).append(worker)
    out: list[Call] = []
    for want in wants:
        here = [w for w in present.get(want.url.rstrip("/"), []) if w.status not in GONE]
        if want.member is True and not here:
            out.append(Call("add", want.server, want.url, "", want.worker_type, want.bootstrap_port))
        elif want.member is False:
            out += [Call("remove", want.server, want.url, w.id, want.worker_type) for w in here]
    return out


def member_id(url: str, listed: Iterable[Listed]) -> str:
    """The id the gateway gave `url` ('' when it is not a live worker there)."""
    for worker in listed:
        if worker.url.rstrip("/") == url.rstrip("/") and worker.status not in GONE:
            return worker.id
    return ""


def others_available(
    model: str, own: Iterable[str], listed: Iterable[Listed], worker_type: str = "regular"
) -> int:
    """Ready workers of `model` that are not this daemon's `own` URLs (what a planned stop leaves serving)."""
    mine = {u.rstrip("/") for u in own}
    return sum(
        1
        for w in listed
        if w.url.rstrip("/") not in mine
        and w.healthy
        and w.status in ("", "ready")
        and (not model or not w.model or w.model == model)
    )


def may_stop(available: int, min_available: int) -> tuple[bool, str]:
    """A planned stop goes ahead only while `min_available` other ready workers remain; why not otherwise."""
    if available >= min_available:
        return True, f"{available} other ready worker(s), min_available {min_available}"
    return False, f"only {available} other ready worker(s) in the gateway, min_available is {min_available}"


TURN_SLOT_S = 3.0  # longer than a leave and its recheck on a loaded host
TURNS = 8  # a pool of more workers reuses the turns (min_available is then small beside it)


def turn_s(url: str, model: str, listed: Iterable[Listed], slot_s: float = TURN_SLOT_S) -> float:
    """How long a planned restart of the worker at `url` waits before its first `min_available` check: its place
    among the model's worker URLs (sorted; every daemon sees the same list), so restarts asked of several daemons
    at once check and leave in turn instead of all leaving in the same instant and emptying the pool until each
    recheck puts them back."""
    urls = {w.url.rstrip("/") for w in listed if not model or not w.model or w.model == model}
    place = sorted(urls | {url.rstrip("/")}).index(url.rstrip("/"))
    return (place % TURNS) * slot_s


def backoff_s(failures: int, base: float = 1.0, cap: float = 30.0) -> float:
    """Seconds before the next try after `failures` failed rounds in a row."""
    return min(cap, base * 2 ** max(0, failures - 1)) if failures else 0.0


def out_of_sync(wants: Mapping[str, bool | None], members: Mapping[str, bool]) -> list[str]:
    """Servers whose membership differs from what is wanted (those with no verdict never do)."""
    return sorted(s for s, want in wants.items() if want is not None and members.get(s, False) != want)
