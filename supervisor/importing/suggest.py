"""The supervisor in the image a server ran in: the GPUs the container sees, and the client's `run` that starts it.

A container given host GPUs by index (`--gpus '"device=2,3"'`, the CDI `--device nvidia.com/gpu=2`, or
`NVIDIA_VISIBLE_DEVICES=2,3`) sees them as 0, 1, … in that order, under their host device nodes (`/dev/nvidia2`,
`/dev/nvidia3`): `gpus` are the indices inside, `gpu_device_paths` those nodes when they are not `/dev/nvidiaN`.
`--gpus all` shows every GPU under its own index, `--gpus N` the first N.

The image is the one examples/Dockerfile builds FROM the container's (`SGLANG_IMAGE:SGLANG_VERSION`, tagged
`sglang-supervisor:VERSION`). The suggested command is the client's own `run` with the container's options as
given (mounts, ports, `--shm-size`, `--ipc`, GPUs, devices, network, user, name…), less what the supervisor
replaces: `--entrypoint` and the command (now the supervisor's `run --config /etc/sglang-supervisor/config.toml`,
as the Dockerfile's ENTRYPOINT, written out so that it holds whatever the image's entrypoint is), `--init` (the
supervisor is its own PID 1 init), `-e` and `--env-file` (their values are in `[servers.env]`; the runtime's
`NVIDIA_*` and the unknown passthrough names stay), `--stop-timeout` (at least the drain budget the shipped unit,
Dockerfile and manifest give, so that a stop drains SGLang before the client kills it). Added: the config bound
at /etc/sglang-supervisor/config.toml, and outside the host's network the status port published on the host's
loopback (the status server then listens on every address of the container, which only that port reaches).
"""

from __future__ import annotations

import csv
import shlex
from dataclasses import dataclass
from pathlib import Path

from policies.pd import Role
from supervisor.config.stopbudget import RECOMMENDED_S as STOP_TIMEOUT_S
from supervisor.host.preflight import CONTAINER_RUNBOOK
from supervisor.importing.container import ContainerRun
from supervisor.importing.incontainer import RUNTIME_PREFIX, Container
from supervisor.importing.infer import ServerPlan

STATUS_PORT = 9400
STATUS_PUBLISH = f"127.0.0.1:{STATUS_PORT}:{STATUS_PORT}"  # the host's loopback only
CONFIG_IN_IMAGE = "/etc/sglang-supervisor/config.toml"
SUPERVISOR_IN_IMAGE = "/opt/sglang-supervisor/venv/bin/sglang-supervisor"  # examples/Dockerfile's ENTRYPOINT
DOCKERFILE = "examples/Dockerfile"
_REPLACED = ("--init", "--entrypoint", "--env", "--env-file", "--stop-timeout")
_CDI_GPU = "nvidia.com/gpu="


@dataclass(frozen=True)
class GpuRequest:
    """The GPUs a container is given: how (`--gpus all`), which host devices (None: all), or how many."""

    given: str
    devices: tuple[str, ...] | None = None
    count: int | None = None


def gpu_request(container: Container) -> GpuRequest | None:
    """What the container's GPUs are, from `--gpus`, CDI `--device`s or `NVIDIA_VISIBLE_DEVICES`; None: none."""
    run = container.run
    flag = run.last("--gpus")
    if flag is not None:
        return _gpus_flag(flag)
    cdi = [v.removeprefix(_CDI_GPU) for v in run.values("--device") if v.startswith(_CDI_GPU)]
    if cdi:
        given = f"CDI {_CDI_GPU}{','.join(cdi)}"
        return GpuRequest(given) if "all" in cdi else GpuRequest(given, tuple(cdi))
    visible = container.runtime_env.get("NVIDIA_VISIBLE_DEVICES")
    if visible is None or visible.strip() in ("", "none", "void"):
        return None
    given = f"NVIDIA_VISIBLE_DEVICES={visible}"
    devices = tuple(d.strip() for d in visible.split(",") if d.strip())
    return GpuRequest(given) if "all" in devices else GpuRequest(given, devices)


def _gpus_flag(value: str) -> GpuRequest:
    """`--gpus all|N|device=…|count=…[,capabilities=…]`, a CSV list as docker reads it."""
    given = shlex.join(["--gpus", value])
    devices: list[str] = []
    count: int | None = None
    for item in next(csv.reader([value]), []):
        key, eq, val = item.partition("=")
        if eq and key == "device":
            devices += [d for d in val.split(",") if d]
        elif eq and key == "count":
            count = int(val) if val.isdigit() else None  # count=all: every GPU
        elif not eq and devices:
            devices.append(key)  # `device=2,3` unquoted: the CSV splits it
        elif not eq and key.isdigit():
            count = int(key)
    return GpuRequest(given, tuple(devices)) if devices else GpuRequest(given, None, count)


def apply(plan: ServerPlan) -> None:
    """Make the plan's GPUs those the container sees (the module docstring), and say what to check."""
    container = plan.container
    if container is None:
        return
    if plan.role is Role.ROUTER:
        return
    _shm_check(plan, container.run)
    request = gpu_request(container)
    if request is None:
        plan.check.append(
            f"{container.run.label} is given no GPUs (--gpus, --device {_CDI_GPU}…, NVIDIA_VISIBLE_DEVICES): "
            "add them to the suggested run"
        )
        return
    if request.devices is None and request.count is None:
        plan.inferred.append(f"gpus: {request.given} shows every GPU inside under its own index")
        return
    seen = len(request.devices) if request.devices is not None else (request.count or 0)
    if any(g >= seen for g in plan.gpus):
        plan.check.append(
            f"gpus {plan.gpus}: the container sees {seen} GPU(s) ({request.given}), numbered from 0 inside: "
            "give it more, or fewer to SGLang"
        )
        return
    if request.devices is None:
        return
    if not all(d.isdigit() for d in request.devices):
        plan.check.append(
            f"{request.given} names GPUs by UUID: inside they are 0…{len(request.devices) - 1} in that order; "
            "set gpu_device_paths to their /dev/nvidiaN nodes (nvidia-smi -L on the host)"
        )
        return
    host = [int(d) for d in request.devices]
    if host[: len(plan.gpus)] == list(range(len(plan.gpus))):
        return
    plan.gpu_device_paths = [f"/dev/nvidia{host[g]}" for g in plan.gpus]
    mapped = ", ".join(f"{host[g]} → {g}" for g in plan.gpus)
    plan.comments["gpus"] = f"inside the container: host GPU {mapped} ({request.given})"
    plan.comments["gpu_device_paths"] = "their device nodes, named as on the host"
    plan.inferred.append(
        f"gpus: {plan.gpus} inside the container (host GPU {mapped}), nodes {plan.gpu_device_paths}"
    )


def shares_host_network(container: Container) -> bool:
    """True with `--network host`: the status server stays on loopback, and no port is published."""
    return container.run.last("--network") == "host"


def _publishes(run: ContainerRun, port: int) -> bool:
    """True when a `-p` of the container already publishes its `port`."""
    return any(p.rsplit(":", 1)[-1].split("/")[0] == str(port) for p in run.values("--publish"))


def built_image(image: str) -> tuple[str, list[str] | None]:
    """The tag of the supervisor's image built FROM `image` and the build's arguments (after `CLIENT build`);
    `image` itself and None when the Dockerfile's `FROM SGLANG_IMAGE:SGLANG_VERSION` cannot name it (a digest)."""
    repo, colon, tag = image.rpartition(":")
    if "@" in image:
        return image, None
    if not colon or "/" in tag:
        repo, tag = image, "latest"
    built = f"sglang-supervisor:{tag}"
    args = ["-f", DOCKERFILE, "--build-arg", f"SGLANG_IMAGE={repo}", "--build-arg", f"SGLANG_VERSION={tag}"]
    return built, [*args, "-t", built, "."]


def run_argv(container: Container, config: str) -> list[str]:
    """The client's `run` of the supervisor in the image built from the container's, with the config at
    `config` on the host."""
    run = container.run
    carried = [w for o in run.options if o.name not in _REPLACED for w in o.words()]
    env = [w for name, value in container.runtime_env.items() for w in ("-e", f"{name}={value}")]
    env += [w for name in container.passthrough for w in ("-e", name)]
    timeouts = [int(v) for v in run.values("--stop-timeout") if v.isdigit()]
    publish = [] if shares_host_network(container) or _publishes(run, STATUS_PORT) else ["-p", STATUS_PUBLISH]
    return [
        run.program,
        *(w for o in run.client_options for w in o.words()),
        *run.subcommand,
        *carried,
        *env,
        *("--stop-timeout", str(max([STOP_TIMEOUT_S, *timeouts]))),
        *publish,
        *("-v", f"{config}:{CONFIG_IN_IMAGE}:ro"),
        *("--entrypoint", SUPERVISOR_IN_IMAGE),
        built_image(run.image)[0],
        *("run", "--config", CONFIG_IN_IMAGE),
    ]


def summary(container: Container, written_to: str | None) -> list[str]:
    """The summary's closing lines for a server that ran in `container`: the suggested run and its notes."""
    run = container.run
    config = str(Path(written_to).absolute()) if written_to else CONFIG_IN_IMAGE
    image, build = built_image(run.image)
    how = (
        f"{shlex.join([run.program, 'build', *build])} (the supervisor's wheel in the build context, as "
        f"{DOCKERFILE} says)"
        if build
        else f"build {DOCKERFILE} FROM {run.image} (its FROM takes a tag: edit it for a digest) and give its tag "
        f"in place of {image}"
    )
    out = [
        "",
        f"run the supervisor inside the image, in place of {run.label} (it starts and owns SGLang there):",
        "  " + shlex.join(run_argv(container, config)),
        f"  - the image must contain the supervisor: {how}",
        f"  - --stop-timeout {STOP_TIMEOUT_S} at least: the supervisor's drain budget ({run.client}'s default of "
        f"10 s kills SGLang mid-drain; {CONTAINER_RUNBOOK})",
    ]
    if written_to is None:
        out.append(f"  - save the config as {CONFIG_IN_IMAGE} on the host: it is bound there read-only")
    out += [f"  - {line}" for line in _not_carried(run)]
    if shares_host_network(container):
        out.append(f"  - status, /metrics, /ready: 127.0.0.1:{STATUS_PORT} of the host (--network host)")
    else:
        out.append(
            f"  - status, /metrics, /ready: {STATUS_PUBLISH} publishes them on the host's loopback; inside, "
            "the status server listens on every address of the container, which only that port reaches"
        )
    check = [
        run.program,
        *run.subcommand,
        "--rm",
        *("-v", f"{config}:{CONFIG_IN_IMAGE}:ro"),
        *("--entrypoint", SUPERVISOR_IN_IMAGE),
        image,
        *("check-config", "--config", CONFIG_IN_IMAGE),
    ]
    return [
        *out,
        "",
        "check as well: stop the old unit (systemctl disable --now UNIT) before starting the supervisor's "
        "container: two launchers on one set of GPUs.",
        f"next: {shlex.join(check)}",
    ]


def _not_carried(run: ContainerRun) -> list[str]:
    """What of the container's options the suggested run leaves out, and why."""
    out: list[str] = []
    if any(o.name == "--init" for o in run.options):
        out.append(
            "not carried: --init: the supervisor is the container's PID 1 and reaps every process itself"
        )
    entry = run.last("--entrypoint")
    if entry is not None:
        out.append(f"not carried: --entrypoint {shlex.quote(entry)}: the supervisor is the command")
    given = [
        f"-e {e.partition('=')[0]}=…"
        for e in run.values("--env")
        if "=" in e and not e.startswith(RUNTIME_PREFIX)
    ]
    given += [f"--env-file {f}" for f in run.values("--env-file")]
    if given:
        out.append(f"not carried: {', '.join(given)}: the values are in the config's [servers.env]")
    short = [v for v in run.values("--stop-timeout") if not v.isdigit() or int(v) < STOP_TIMEOUT_S]
    if short:
        out.append(f"--stop-timeout {short[-1]} raised to {STOP_TIMEOUT_S}")
    return out


def _shm_check(plan: ServerPlan, run: ContainerRun) -> None:
    """`/dev/shm` as SGLang and NCCL need it, and the host's `/dev/shm` (`--ipc host`) said to be a risk."""
    ipc = run.last("--ipc")
    if ipc == "host":
        plan.check.append(
            "--ipc host: the container shares the host's /dev/shm, where the supervisor's sweep of a dead run's "
            "files cannot see holders outside the container; --shm-size (e.g. 32g) keeps it the container's own"
        )
    elif run.last("--shm-size") is None and ipc in (None, "private", "shareable"):
        plan.check.append(
            f"no --shm-size: {run.client}'s 64 MB /dev/shm is too small for SGLang and NCCL; add --shm-size 32g"
        )
