"""Several sources → one deployment: server names, and what two servers on one host must not share.

One host runs one supervisor, which owns every SGLang server of that host; a PD pair given as two units (plus
a router's) therefore becomes one config with a server each, never two configs (two daemons would fight over
the same state directory, status port and GPUs). A server that ran in a container is imported alone: its
supervisor runs in that container's image, which neither another container's servers nor a host's programs share.
"""

from __future__ import annotations

import re
from collections import Counter

from policies import argv
from policies.pd import Role
from supervisor.importing import suggest
from supervisor.importing.infer import ServerPlan, family_of, plan_server
from supervisor.importing.source import ImportProblem, Source

SGLANG_DEFAULT_PORT = 30000
BOOTSTRAP_DEFAULT_PORT = 8998
_NOT_NAME = re.compile(r"[^a-z0-9_-]+")


def _clean(text: str) -> str:
    """`text` as a server name (`[a-z0-9][a-z0-9_-]*`, at most 63 characters), "" when nothing is left."""
    name = _NOT_NAME.sub("-", text.lower()).strip("-_")
    return name[:63].rstrip("-_")


def server_name(plan: ServerPlan) -> str:
    """The unit's name without an `sglang` prefix; else the role of a PD server or router, else the model's
    family or directory name; else `sglang`."""
    hint = _clean(plan.name)
    trimmed = re.sub(r"^sglang[-_]?", "", hint)
    if trimmed or hint:
        return trimmed or hint
    if plan.role is not Role.UNIFIED:
        return plan.role.value
    model = argv.value(plan.args, "--model-path") or ""
    return _clean(family_of(model) or model.rstrip("/").rsplit("/", 1)[-1]) or "sglang"


def plan_deployment(sources: list[Source], parsers: str) -> list[ServerPlan]:
    """One server per source, named uniquely, with what would clash between them said in their checks;
    ImportProblem for a container among several sources."""
    contained = [(s.label, s.container.run.label) for s in sources if s.container is not None]
    if contained and len(sources) > 1:
        label, container = contained[0]
        raise ImportProblem(
            f"{label}: {container} is imported alone (its supervisor runs in its image, which the other "
            "servers do not share); import each container's unit by itself, or write the SGLang commands as "
            "the ExecStart= of plain units, import those together and run that supervisor inside one image "
            "(examples/Dockerfile)"
        )
    plans = [plan_server(source, parsers) for source in sources]
    for plan in plans:
        suggest.apply(plan)
    taken: set[str] = set()
    for plan in plans:
        base = server_name(plan)
        name, n = base, 1
        while name in taken:
            n += 1
            name = f"{base}-{n}"
        taken.add(name)
        plan.name = name
    _clashes(plans)
    return plans


def _ports(plan: ServerPlan) -> list[int]:
    table = argv.EXACT if plan.role is Role.ROUTER else argv.SGLANG
    raw = argv.value(plan.args, "--port", table)
    ports = [int(raw) if raw and raw.isdigit() else SGLANG_DEFAULT_PORT]
    if plan.role is Role.PREFILL:
        boot = argv.value(plan.args, "--disaggregation-bootstrap-port")
        ports.append(int(boot) if boot and boot.isdigit() else BOOTSTRAP_DEFAULT_PORT)
    return ports


def _clashes(plans: list[ServerPlan]) -> None:
    """GPUs or ports two servers would share, and a decode without a prefill, in the checks of the later one."""
    gpus: dict[int, str] = {}
    ports: dict[int, str] = {}
    for plan in plans:
        shared = sorted({g for g in plan.gpus if gpus.setdefault(g, plan.name) != plan.name})
        if shared:
            plan.check.append(f"GPUs {shared} are also {gpus[shared[0]]}'s: give each server its own")
        for port in _ports(plan):
            if ports.setdefault(port, plan.name) != plan.name:
                plan.check.append(f"port {port} is also {ports[port]}'s: give each server its own")
    roles = Counter(plan.role for plan in plans)
    if roles[Role.DECODE] and not roles[Role.PREFILL]:
        for plan in plans:
            if plan.role is Role.DECODE:
                plan.check.append(
                    "a decode server needs its prefill in the same config: import both units together"
                )
