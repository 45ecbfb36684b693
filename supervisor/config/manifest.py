"""`check-config --manifest FILE`: a Kubernetes manifest held against the config of the supervisor it runs.

The manifest's pod (a Pod, or the pod template of a Deployment, StatefulSet, DaemonSet or Job; several YAML
documents may be given, a Service beside it is ignored) must give the supervisor what it needs: a grace period
(`terminationGracePeriodSeconds`, 30 s when unset) at least the stop budget, a liveness probe on `/healthz` and a
readiness probe on `/ready` or `/servers/<name>/ready` of the supervisor's own port, `/dev/shm` large enough for
NCCL (a memory-backed `emptyDir` mounted there, or `hostIPC`), GPUs requested through the device plugin. Each
shortfall is a warning naming the field; the config stays valid.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from supervisor.config.models import Config
from supervisor.config.stopbudget import stop_budget

POD_KINDS = {"Deployment": "spec.template.spec", "StatefulSet": "spec.template.spec",
             "DaemonSet": "spec.template.spec", "Job": "spec.template.spec", "Pod": "spec"}  # fmt: skip
DEFAULT_GRACE_S = 30  # Kubernetes' terminationGracePeriodSeconds when the pod does not set it
SUPERVISOR_WORDS = ("sglang-supervisor",)


class ManifestError(Exception):
    """The manifest cannot be read or holds no pod: one line, exit 1."""


def _pods(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """(the pod spec's field path, the pod spec) of every workload in the file."""
    try:
        documents = [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d]
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ManifestError(f"cannot read {path}: {exc}") from exc
    for doc in documents:
        if not isinstance(doc, dict) or doc.get("kind") not in POD_KINDS:
            continue
        where = POD_KINDS[str(doc["kind"])]
        spec: Any = doc
        for key in where.split("."):
            spec = spec.get(key, {}) if isinstance(spec, dict) else {}
        name = (doc.get("metadata") or {}).get("name", "?")
        yield f"{doc['kind']} {name}: {where}", spec if isinstance(spec, dict) else {}


def _container(spec: dict[str, Any]) -> tuple[int, dict[str, Any]] | None:
    """The container that runs the supervisor (by its command, args or image), else the only one."""
    containers = [c for c in spec.get("containers") or [] if isinstance(c, dict)]
    for i, c in enumerate(containers):
        words = " ".join(
            str(w) for w in [*(c.get("command") or []), *(c.get("args") or []), c.get("image", "")]
        )
        if any(word in words for word in SUPERVISOR_WORDS):
            return i, c
    return (0, containers[0]) if len(containers) == 1 else None


def check_manifest(path: Path, config: Config) -> list[str]:
    """Warnings for every pod of the manifest at `path` (ManifestError when it has none)."""
    warnings: list[str] = []
    found = False
    for where, spec in _pods(path):
        found = True
        warnings += [f"{where}.{line}" for line in _check_pod(spec, config)]
    if not found:
        raise ManifestError(f"{path}: no Pod, Deployment, StatefulSet, DaemonSet or Job in it")
    return warnings


def _check_pod(spec: dict[str, Any], config: Config) -> list[str]:
    out: list[str] = []
    budget = stop_budget(config)
    grace = spec.get("terminationGracePeriodSeconds", DEFAULT_GRACE_S)
    if not isinstance(grace, int) or grace < budget.seconds:
        out.append(
            f"terminationGracePeriodSeconds: {grace} is shorter than the supervisor's stop budget of "
            f"{budget.seconds} s ({budget.why}): the kubelet's SIGKILL would end the pod mid-drain"
        )
    chosen = _container(spec)
    if chosen is None:
        return [*out, "containers: none runs sglang-supervisor (by its command, args or image)"]
    index, container = chosen
    at = f"containers[{index}]"
    port = config.supervisor.http.port
    ready = {"/ready", *(f"/servers/{s.name}/ready" for s in config.servers)}
    out += _probe(container, "livenessProbe", {"/healthz"}, port, at)
    out += _probe(container, "readinessProbe", ready, port, at)
    mounts = {
        m.get("mountPath"): m.get("name") for m in container.get("volumeMounts") or [] if isinstance(m, dict)
    }
    memory = {
        v.get("name")
        for v in spec.get("volumes") or []
        if (v.get("emptyDir") or {}).get("medium") == "Memory"
    }
    if not spec.get("hostIPC") and mounts.get("/dev/shm") not in memory:
        out.append(
            f"{at}.volumeMounts: no memory-backed emptyDir at /dev/shm (and no hostIPC): the runtime's 64 MiB "
            "/dev/shm breaks NCCL and SGLang's shared-memory queues"
        )
    limits = (container.get("resources") or {}).get("limits") or {}
    gpus = sum(len(s.gpus) for s in config.servers)
    if gpus and str(limits.get("nvidia.com/gpu", "")) != str(gpus):
        out.append(
            f"{at}.resources.limits.nvidia.com/gpu: {limits.get('nvidia.com/gpu', 'unset')}; the config's "
            f"servers own {gpus} GPU(s)"
        )
    if spec.get("shareProcessNamespace"):
        out.append(
            "shareProcessNamespace: true makes the pause container PID 1: the supervisor is then not the "
            "container's init, and a crash of the daemon ends the container (and SGLang's load) instead of "
            "being restarted in place"
        )
    return out


def _probe(container: dict[str, Any], kind: str, paths: set[str], port: int, at: str) -> list[str]:
    probe = container.get(kind)
    want = " or ".join(sorted(paths))
    if not isinstance(probe, dict) or not isinstance(probe.get("httpGet"), dict):
        return [f"{at}.{kind}: none (or not httpGet); the supervisor answers {want} on port {port}"]
    get = probe["httpGet"]
    out = []
    if get.get("path") not in paths:
        out.append(f"{at}.{kind}.httpGet.path: {get.get('path')!r}; the supervisor answers {want}")
    if not _same_port(get.get("port"), port, container):
        out.append(f"{at}.{kind}.httpGet.port: {get.get('port')!r}; the supervisor listens on {port}")
    return out


def _same_port(given: Any, port: int, container: dict[str, Any]) -> bool:
    """A probe's port, a number or the name of one of the container's ports, is the supervisor's."""
    if isinstance(given, int):
        return given == port
    named = {
        p.get("name"): p.get("containerPort") for p in container.get("ports") or [] if isinstance(p, dict)
    }
    return named.get(given) == port
