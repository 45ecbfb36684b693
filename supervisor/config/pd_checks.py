"""`check-config` warnings for a PD deployment whose SGLang settings turn SGLang's own PD detection off.

A prefill gives up on a decode that never bootstraps after `SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT` (300 s), a
decode on KV that never comes after `SGLANG_DISAGGREGATION_WAITING_TIMEOUT` (300 s), and a decode drops a prefill
whose bootstrap server missed `SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE` beats `…_HEARTBEAT_INTERVAL` s apart
(2 × 5 s), failing the requests bound to it. Production recipes set the timeouts to 100000: the supervisor is
then the only detector of a transfer wedge. That is allowed (said, never refused); a heartbeat that outlasts a
prefill's relaunch makes the decode keep the old prefill's endpoints, so the daemon restarts it after every
prefill relaunch whose pair canary fails.
"""

from __future__ import annotations

from collections.abc import Mapping

from policies.pd import Role
from supervisor.config.models import Config

OFF_S = 3600.0  # a SGLang PD timeout this long no longer detects anything an operator would wait for
TIMEOUTS = {
    Role.PREFILL: ("SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT", 300.0, "a decode that never bootstraps"),
    Role.DECODE: ("SGLANG_DISAGGREGATION_WAITING_TIMEOUT", 300.0, "KV that never comes"),
}
HEARTBEAT_S = 60.0  # a decode that keeps a dead prefill this long outlasts a fast relaunch


def _number(env: Mapping[str, str], name: str, default: float) -> float:
    try:
        return float(env.get(name, default))
    except ValueError:
        return default


def pd_warnings(config: Config, daemon_env: Mapping[str, str]) -> list[str]:
    """What each prefill's and decode's environment turns off of SGLang's own PD detection."""
    found = []
    for i, server in enumerate(config.servers):
        if server.role not in TIMEOUTS:
            continue
        env = {**daemon_env, **server.env}
        at = f"servers[{i}].env ({server.name})"
        name, default, what = TIMEOUTS[server.role]
        value = _number(env, name, default)
        if value >= OFF_S:
            found.append(
                f"{at}: {name}={value:g} turns SGLang's own wait for {what} off in practice — the supervisor is "
                f"the only detector of a transfer wedge (stall_after_s = {server.probes.stall_after_s:g} s)"
            )
        if server.role is Role.DECODE:
            interval = _number(env, "SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL", 5.0)
            failures = _number(env, "SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE", 2.0)
            if interval * failures >= HEARTBEAT_S:
                found.append(
                    f"{at}: the decode drops a dead prefill only after {interval * failures:g} s of missed "
                    "heartbeats — its requests bound to a dead prefill wait that long, and after a prefill "
                    "relaunch the decode keeps the old endpoints until the daemon restarts it"
                )
    return found


def _router_workers(args: tuple[str, ...] | list[str]) -> list[tuple[str, str, str | None]]:
    """A PD router's `--prefill URL [BOOTSTRAP_PORT]` and `--decode URL` arguments: (flag, url, port or None)."""
    out: list[tuple[str, str, str | None]] = []
    for i, arg in enumerate(args):
        if arg not in ("--prefill", "--decode") or i + 1 >= len(args):
            continue
        url = args[i + 1].rstrip("/")
        port = args[i + 2] if arg == "--prefill" and i + 2 < len(args) else None
        out.append(
            (arg, url, port if port is not None and not port.startswith("-") and "://" not in port else None)
        )
    return out


def router_warnings(config: Config) -> list[str]:
    """A PD router of this config that sends a decode to a bootstrap endpoint it cannot reach: a `--prefill` of one
    of the config's prefills without that prefill's bootstrap port, or the roles swapped."""
    found = []
    workers = {
        url.rstrip("/"): s
        for s in config.servers
        if s.role in (Role.PREFILL, Role.DECODE)
        for url in {s.base_url, s.gateway_url}
    }
    for i, server in enumerate(config.servers):
        if server.role is not Role.ROUTER:
            continue
        at = f"servers[{i}].args ({server.name})"
        for flag, url, port in _router_workers(server.args):
            worker = workers.get(url)
            if worker is None:
                continue
            wanted = Role.PREFILL if flag == "--prefill" else Role.DECODE
            if worker.role is not wanted:
                found.append(f"{at}: {flag} {url} is the {worker.role.value} {worker.name!r} of this config")
            elif worker.role is Role.PREFILL and port != str(worker.bootstrap_port):
                found.append(
                    f"{at}: --prefill {url} {port or '(no bootstrap port)'}: the prefill {worker.name!r} "
                    f"bootstraps on {worker.bootstrap_port} — the router tells each decode that port, the decode "
                    "cannot fetch the KV, and every request through this router fails"
                )
    return found
