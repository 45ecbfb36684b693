"""`check-config --compose FILE`: a Compose file held against the config of the supervisor it runs.

The service that runs the supervisor (by its image, entrypoint or command; else the only one) must give it what it
needs: a `stop_grace_period` (Compose's default 10 s when unset) at least the stop budget, SIGTERM as the stop
signal, no `init: true` (the engine's init would be PID 1, and a crash of the daemon would end the container), a
health check on `/healthz` of the supervisor's port when it replaces the image's, `/dev/shm` large enough for NCCL
(`ipc: host` or a `shm_size`), and the config's GPUs reserved through `deploy.resources.reservations.devices` (or
`gpus`). Each shortfall is a warning naming the field; the config stays valid.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from supervisor.config.manifest import SUPERVISOR_WORDS, ManifestError
from supervisor.config.models import Config
from supervisor.config.stopbudget import stop_budget

DEFAULT_GRACE_S = 10.0  # Compose's stop_grace_period when the service does not set it
SPANS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6}
MIN_SHM = 1 << 30  # less than 1 GiB of /dev/shm is the runtime's 64 MiB default in all but name
SIZES = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "m": 1 << 20, "mb": 1 << 20, "g": 1 << 30, "gb": 1 << 30}


class ComposeError(ManifestError):
    """The Compose file cannot be read or holds no service: one line, exit 1."""


def seconds(value: Any) -> float | None:
    """A Compose duration (`180s`, `1m30s`, `500ms`, or a number of seconds) in seconds; None when it is not one."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    text = str(value).strip()
    parts = re.findall(r"(\d+(?:\.\d+)?)(h|ms|us|m|s)", text)
    if not parts or "".join(n + u for n, u in parts) != text:
        return None
    return sum(float(n) * SPANS[u] for n, u in parts)


def _bytes(value: Any) -> int | None:
    found = re.fullmatch(r"(\d+)\s*([kmg]?b?)", str(value).strip().lower())
    return int(found.group(1)) * SIZES[found.group(2)] if found else None


def _services(path: Path) -> dict[str, dict[str, Any]]:
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ComposeError(f"cannot read {path}: {exc}") from exc
    services = doc.get("services") if isinstance(doc, dict) else None
    if not isinstance(services, dict) or not services:
        raise ComposeError(f"{path}: no services in it")
    return {str(k): v for k, v in services.items() if isinstance(v, dict)}


def _service(services: dict[str, dict[str, Any]]) -> tuple[str, dict[str, Any]] | None:
    """The service that runs the supervisor (by its image, entrypoint or command), else the only one."""
    for name, svc in services.items():
        words = " ".join(str(svc.get(k, "")) for k in ("image", "entrypoint", "command"))
        if any(word in words for word in SUPERVISOR_WORDS):
            return name, svc
    return next(iter(services.items())) if len(services) == 1 else None


def check_compose(path: Path, config: Config) -> list[str]:
    """Warnings for the supervisor's service of the Compose file at `path` (ComposeError when it has none)."""
    chosen = _service(_services(path))
    if chosen is None:
        return ["services: none runs sglang-supervisor (by its image, entrypoint or command)"]
    name, svc = chosen
    return [f"services.{name}.{line}" for line in _check_service(svc, config)]


def _check_service(svc: dict[str, Any], config: Config) -> list[str]:
    out: list[str] = []
    budget = stop_budget(config)
    given = svc.get("stop_grace_period", f"{DEFAULT_GRACE_S:g}s")
    grace = seconds(given)
    if grace is None or grace < budget.seconds:
        out.append(
            f"stop_grace_period: {given} is shorter than the supervisor's stop budget of {budget.seconds} s "
            f"({budget.why}): the engine's SIGKILL would end the container mid-drain"
        )
    if str(svc.get("stop_signal", "SIGTERM")).upper() not in ("SIGTERM", "TERM"):
        out.append(f"stop_signal: {svc['stop_signal']}; the supervisor drains on SIGTERM")
    if svc.get("init") is True:
        out.append(
            "init: true makes the engine's init PID 1: a crash of the daemon then ends the container (and "
            "SGLang's load) instead of being restarted in place"
        )
    out += _healthcheck(svc.get("healthcheck"), config.supervisor.http.port)
    shm = _bytes(svc.get("shm_size", 0))
    if svc.get("ipc") != "host" and (shm is None or shm < MIN_SHM):
        out.append(
            f"ipc/shm_size: no `ipc: host` and shm_size {svc.get('shm_size', 'unset')}: the runtime's 64 MiB "
            "/dev/shm breaks NCCL and SGLang's shared-memory queues"
        )
    gpus = sum(len(s.gpus) for s in config.servers)
    reserved = _gpus(svc)
    if gpus and reserved != "all" and reserved != gpus:
        out.append(
            f"deploy.resources.reservations.devices: {reserved or 'no'} GPU(s) reserved; the config's servers "
            f"own {gpus} GPU(s)"
        )
    return out


def _healthcheck(check: Any, port: int) -> list[str]:
    """A service's own health check, when it replaces the image's: on `/healthz` of the supervisor's port."""
    if not isinstance(check, dict) or ("test" not in check and not check.get("disable")):
        return []
    if check.get("disable") or check.get("test") in (["NONE"], "NONE"):
        return ["healthcheck: disabled; the image's checks the daemon's /healthz"]
    test = " ".join(map(str, check["test"])) if isinstance(check["test"], list) else str(check["test"])
    if "/healthz" not in test or f":{port}" not in test:
        return [f"healthcheck.test: {test!r}; the supervisor answers /healthz on port {port}"]
    return []


def _gpus(svc: dict[str, Any]) -> int | str:
    """GPUs reserved for the service: a count, "all", or 0."""
    if svc.get("gpus") == "all":
        return "all"
    devices = ((svc.get("deploy") or {}).get("resources") or {}).get("reservations", {}).get("devices") or []
    total = 0
    for device in devices if isinstance(devices, list) else []:
        if not isinstance(device, dict) or "gpu" not in (device.get("capabilities") or []):
            continue
        if device.get("count") == "all":
            return "all"
        total += len(device.get("device_ids") or []) or int(device.get("count") or 0)
    return total
