"""A server that runs in a container today: the SGLang command inside it, and the container's environment.

The supervisor cannot own a server through its container client: killing `docker run` (or podman's, or
nerdctl's) leaves the container running on the GPUs. So the import reads the client's `run` (`container`) and
takes what the container runs: `--entrypoint` and the words after the image, a shell wrapper unwrapped by
`shell`, as the command runs inside the image (a bare `python3` is the image's); it must be an SGLang launcher
(`launchers`). The environment is the container's, as docker builds it: every `--env-file` (a `NAME=value` line
verbatim, a bare `NAME` from the client's environment), then every `-e NAME=value` or `-e NAME` (from the
client's environment: the unit's, or the assignments before the command). `NVIDIA_*` variables are the container
runtime's (it reads them when it creates the container), so they stay on the client's command line, with each
`-e NAME` whose value the import does not know. Anything else is refused, naming the container and what to do:
a client that does not start one container (`compose`, `start`, `exec`, `kubectl`…), no image, a command that is
not SGLang's (a script, the image's default command, another `--entrypoint`).
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from supervisor.host.preflight import container_client
from supervisor.importing.container import RUN_CLIENTS, ContainerRefused, ContainerRun, parse_run
from supervisor.importing.launchers import split_command
from supervisor.importing.shell import ShellScriptRefused, is_wrapper, unwrap
from supervisor.importing.words import WHITESPACE, is_env_name

ADVICE = (
    "give the SGLang command it runs with `import -- python3 -m sglang.launch_server …` and run the supervisor "
    "inside the image (examples/Dockerfile)"
)
_ADVICE_ONE = (
    "give the SGLang command of one container with `import -- python3 -m sglang.launch_server …` and run the "
    "supervisor inside its image (examples/Dockerfile)"
)
RUNTIME_PREFIX = "NVIDIA_"
_LAUNCHERS = (
    "python3 -m sglang.launch_server, sglang serve, python3 -m sglang_router.launch_router, the simulator"
)


@dataclass
class Container:
    """The container a server runs in today, with what its client must still pass when it runs the supervisor."""

    run: ContainerRun
    runtime_env: dict[str, str] = field(default_factory=dict)  # NVIDIA_*: read by the container runtime
    passthrough: list[str] = field(default_factory=list)  # `-e NAME` whose value the import does not know


@dataclass
class Inside:
    """The SGLang command a container runs, its environment, and what the summary says about them."""

    argv: list[str]
    env: dict[str, str]
    container: Container
    notes: list[str] = field(default_factory=list)
    check: list[str] = field(default_factory=list)


def inside(argv: list[str], client_env: Mapping[str, str]) -> Inside:
    """The server inside the container `argv` (a container client's command line) runs; ContainerRefused when
    it cannot be inferred. `client_env` is the environment the client itself gets."""
    client = container_client(argv) or argv[0]
    if client not in RUN_CLIENTS:
        raise ContainerRefused(
            f"`{client}` starts containers through its daemon or API, perhaps several; {_ADVICE_ONE}"
        )
    try:
        run = parse_run(argv)
    except ContainerRefused as exc:
        raise ContainerRefused(f"{_name(argv)}{exc}; {_subcommand_advice(argv)}{ADVICE}") from exc
    found = Inside([], {}, Container(run))
    _environment(run, client_env, found)
    entry = run.last("--entrypoint")
    words = [entry, *run.command] if entry else list(run.command)
    if not words:
        raise ContainerRefused(
            f"{run.label} runs the image's default command, which the import cannot see; {ADVICE}"
        )
    if is_wrapper(words):
        try:
            script = unwrap(words, found.env)
        except ShellScriptRefused as exc:
            raise ContainerRefused(f"{run.label} runs `{words[0]} {words[1]}`: {exc}; {ADVICE}") from exc
        words = script.argv
        found.env.update(script.env)
        found.notes += [f"in the container: {line}" for line in script.notes]
        found.check += [f"in the container: {line}" for line in script.check]
    if split_command(words)[2] is None:
        given = f" (--entrypoint {entry})" if entry else ""
        raise ContainerRefused(
            f"{run.label} runs `{shlex.join(words[:4])}{' …' if len(words) > 4 else ''}`{given}, not an SGLang "
            f"command ({_LAUNCHERS}); {ADVICE}"
        )
    found.argv = words
    found.notes.append(
        f"{run.client} run of {run.label}: the server is the SGLang command inside it, as it runs in the image; "
        "the supervisor runs in the same image (the suggested run below)"
    )
    if client_env:
        found.notes.append(
            f"the environment {run.client} itself gets is not the container's: only what -e and --env-file pass"
        )
    return found


def _name(argv: list[str]) -> str:
    """`container NAME: ` from a `--name` of a command line that could not be read, else nothing."""
    for i, word in enumerate(argv):
        if word.startswith("--name="):
            return f"container {word.partition('=')[2]}: "
        if word == "--name" and i + 1 < len(argv):
            return f"container {argv[i + 1]}: "
    return ""


def _subcommand_advice(argv: list[str]) -> str:
    """What to look at for a client command that is not `run` (`docker start NAME`: the existing container)."""
    words = [w for w in argv[1:] if not w.startswith("-")]
    if words[:1] == ["start"] and len(words) > 1:
        return f"`{Path(argv[0]).name} inspect {words[1]}` shows the command of that existing container; "
    return ""


def _environment(run: ContainerRun, client_env: Mapping[str, str], found: Inside) -> None:
    """The container's environment as the client builds it: the env files, then `-e`, in order."""
    env: dict[str, str] = {}
    for spec in run.values("--env-file"):
        try:
            text = Path(spec).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            found.check.append(
                f"--env-file {spec}: cannot read it here ({getattr(exc, 'strerror', None) or exc}): its "
                f"variables are not in the config; {run.client} would refuse to start without it"
            )
            continue
        for line in text.removeprefix("\ufeff").splitlines():
            entry = line.lstrip(WHITESPACE)
            if entry and not entry.startswith("#"):
                _assign(entry, f"--env-file {spec}", client_env, env, found)
        found.notes.append(f"--env-file {spec}: read as {run.client} reads it")
    for entry in run.values("--env"):
        _assign(entry, "-e", client_env, env, found)
    for name in [n for n in env if n.startswith(RUNTIME_PREFIX)]:
        found.container.runtime_env[name] = env.pop(name)
    found.env = env


def _assign(
    entry: str, where: str, client_env: Mapping[str, str], env: dict[str, str], found: Inside
) -> None:
    """One `NAME=value` (taken verbatim) or `NAME` (the client's own value, when the import knows it)."""
    name, eq, value = entry.partition("=")
    name = name.lstrip(WHITESPACE)
    if not is_env_name(name):
        found.check.append(f"{where} {name!r}: not a variable name; left out")
    elif eq:
        env[name] = value
    elif name in client_env:
        env[name] = client_env[name]
    else:
        found.container.passthrough.append(name)
        found.check.append(
            f"{where} {name}: passed from the environment of whoever runs the client, unknown here; the "
            f"suggested run passes it on the same way (the supervisor hands its environment to SGLang)"
        )
