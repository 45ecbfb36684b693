"""What a server is started with today: the argv and environment systemd (or the shell) would give it.

`from_unit` reads a service unit (and its drop-ins, `UNIT.d/*.conf`, in name order) the way systemd does:
`Environment=` lines in order (a later assignment wins; an empty `Environment=` resets), then every
`EnvironmentFile=` in order on top of them (a file's settings override `Environment=`; `-/path` may be missing;
a glob reads every match in order), then the one `ExecStart=` command with its prefixes, its `%` specifiers and
its variables expanded from that environment. `from_command` takes a command line the shell already split;
leading `NAME=value` words (or `env NAME=value …`) are its environment. Either may be a shell wrapper
(`bash -c 'source …/activate && exec python -m …'`), unwrapped by `supervisor.importing.shell`, and either may
start a container (`docker run … IMAGE python3 -m sglang.launch_server …`): the server is then the command
inside it, with the container's environment (`supervisor.importing.incontainer`).
"""

from __future__ import annotations

import glob
import os
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from supervisor.host.preflight import container_client
from supervisor.importing.container import ContainerRefused
from supervisor.importing.incontainer import Container, inside
from supervisor.importing.shell import ShellScriptRefused, is_wrapper, unwrap
from supervisor.importing.unitfile import Setting, parse_env_file, parse_unit
from supervisor.importing.words import (
    ExecCommand,
    UnitSyntaxError,
    expand_argv,
    expand_specifiers,
    is_env_name,
    split_exec,
    split_words,
)

# systemd's fixed search path for an ExecStart= program given without a directory (systemd.service(5)).
SYSTEMD_PATH = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")
# Variables systemd sets itself when it starts a service: unknown until then.
_SYSTEMD_SET = {"USER", "LOGNAME", "HOME", "SHELL", "INVOCATION_ID", "MAINPID", "RUNTIME_DIRECTORY",
                "STATE_DIRECTORY", "CACHE_DIRECTORY", "LOGS_DIRECTORY", "CONFIGURATION_DIRECTORY",
                "CREDENTIALS_DIRECTORY", "PATH", "LANG", "NOTIFY_SOCKET"}  # fmt: skip
# [Service] settings the import reads; any other is listed as not carried over.
_READ = {"ExecStart", "Environment", "EnvironmentFile"}
_PREFIX_NOTES = {
    "-": "ExecStart=- (exit status ignored): the supervisor treats every exit of the server as a fault",
    "+": "ExecStart=+ (full privileges): the supervisor starts SGLang as its own user (the unit's User=)",
    "!": "ExecStart=! (no User= switch): the supervisor starts SGLang as its own user (the unit's User=)",
    ":": "ExecStart=: (no variable substitution): the words were taken as written",
}


class ImportProblem(Exception):
    """Input the import cannot turn into a server: said in one line, exit 1."""


@dataclass
class Source:
    """One server as it is started today."""

    label: str  # the unit's file name, or "the command line"
    name_hint: str  # what the server may be called (the unit's name without its suffix; "" for a command)
    argv: list[str]  # the program first, then its arguments
    env: dict[str, str]
    read: list[str] = field(default_factory=list)  # what was read and how (summary)
    check: list[str] = field(default_factory=list)  # what the operator must look at (summary)
    container: Container | None = None  # the container it runs in today (argv and env are what runs inside)


def from_unit(path: Path, stdin: TextIO = sys.stdin) -> Source:
    """The server a service unit starts (`-`: the unit's text, or just its `ExecStart=` and `Environment=`
    lines, on stdin); ImportProblem when it cannot be read or starts no one command."""
    dropins: list[Path] = []
    try:
        if str(path) == "-":
            settings = parse_unit(stdin.read(), "stdin")
        else:
            settings = parse_unit(path.read_text(encoding="utf-8"), path.name)
            dropins = sorted((path.parent / f"{path.name}.d").glob("*.conf"))
        for dropin in dropins:
            settings += parse_unit(dropin.read_text(encoding="utf-8"), f"{dropin.parent.name}/{dropin.name}")
    except (OSError, UnicodeDecodeError) as exc:
        raise ImportProblem(f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}") from exc
    label = "stdin" if str(path) == "-" else path.name
    unit = label if label.endswith(".service") else f"{label}.service"
    source = Source(label, "" if label == "stdin" else unit.rsplit(".", 1)[0], [], {})
    if dropins:
        source.read.append(f"drop-ins: {', '.join(d.name for d in dropins)}")
    service = [s for s in settings if s.section in ("Service", "")]  # pasted lines have no [Service] header
    try:
        env = _environment(service, unit, source)
        _command(service, unit, env, source)
    except UnitSyntaxError as exc:
        raise ImportProblem(f"{path}: {exc}") from exc
    other = [f"{s.key}={s.value}" for s in service if s.key not in _READ]
    if other:
        source.check.append(f"not carried over (the supervisor's own unit decides these): {', '.join(other)}")
    return source


def _environment(service: list[Setting], unit: str, source: Source) -> dict[str, str]:
    """`Environment=` then `EnvironmentFile=`, as systemd applies them."""
    env: dict[str, str] = {}
    files: list[str] = []
    warnings: list[str] = []
    for s in service:
        if s.key == "Environment" and not s.value:
            env.clear()
        elif s.key == "Environment":
            for word in split_words(s.value).words:
                name, eq, value = expand_specifiers(word, unit, warnings).partition("=")
                if eq and is_env_name(name):
                    env[name] = value
                else:
                    warnings.append(f"{s.where}: {word!r} is not NAME=VALUE; ignored as systemd ignores it")
        elif s.key == "EnvironmentFile":
            files = [] if not s.value else [*files, expand_specifiers(s.value, unit, warnings)]
    for spec in files:
        env.update(_env_file(spec, source))
    source.check += warnings
    return env


def _env_file(spec: str, source: Source) -> dict[str, str]:
    optional = spec.startswith("-")
    pattern = spec[1:] if optional else spec
    paths = sorted(glob.glob(pattern)) if glob.has_magic(pattern) else [pattern]
    found: dict[str, str] = {}
    for name in paths:
        try:
            text = Path(name).read_text(encoding="utf-8")
        except FileNotFoundError:
            if optional:
                source.read.append(f"EnvironmentFile={spec}: missing, allowed by '-'")
            else:
                source.check.append(f"EnvironmentFile={spec} is missing here: systemd would refuse to start")
            continue
        except (OSError, UnicodeDecodeError) as exc:
            source.check.append(f"EnvironmentFile={spec}: cannot read {name}: {exc}")
            continue
        pairs, ignored = parse_env_file(text)
        found.update(pairs)
        source.read.append(f"EnvironmentFile={spec}: {len(pairs)} variable(s) from {name}")
        source.check += [f"{name}: {line}" for line in ignored]
    if not paths and not optional:
        source.check.append(f"EnvironmentFile={spec} matches no file: systemd would refuse to start")
    return found


def _command(service: list[Setting], unit: str, env: dict[str, str], source: Source) -> None:
    """The one `ExecStart=` command, expanded as systemd expands it when it starts the service."""
    commands: list[ExecCommand] = []
    for s in service:
        if s.key == "ExecStart":
            commands = [] if not s.value else [*commands, *split_exec(s.value)]
    if len(commands) != 1:
        what = "no ExecStart=" if not commands else f"{len(commands)} ExecStart= commands"
        raise UnitSyntaxError(f"{what}; the import needs the one command that starts SGLang")
    cmd = commands[0]
    warnings = list(cmd.warnings)
    argv = tuple(expand_specifiers(w, unit, warnings) for w in cmd.argv)
    program = expand_specifiers(cmd.path, unit, warnings)
    unset: set[str] = set()
    words = expand_argv(argv, env, unset) if cmd.expands_variables else list(argv)
    for name in sorted(unset):
        why = "set by systemd when it starts the unit" if name in _SYSTEMD_SET else "not set by the unit"
        warnings.append(f"${name} in ExecStart= expanded to nothing ({why}): check the args")
    if "@" in cmd.prefixes:
        source.read.append(f"ExecStart=@: argv[0] {argv[0]!r} not kept (the supervisor passes the program)")
    source.check += [_PREFIX_NOTES[p] for p in dict.fromkeys(cmd.prefixes) if p in _PREFIX_NOTES]
    source.argv = [program, *words[1:]]
    source.env = env
    source.check += warnings
    _unwrap_shell(source)
    _enter_container(source)
    if source.container is None:
        source.argv[0] = _systemd_program(source.argv[0], source)


def _unwrap_shell(source: Source) -> None:
    """`bash -c 'source venv/bin/activate && exec python -m …'` → the command the script runs."""
    if not is_wrapper(source.argv):
        return
    try:
        found = unwrap(source.argv, source.env)
    except ShellScriptRefused as exc:
        raise ImportProblem(
            f"{source.label}: {source.argv[0]} {source.argv[1]}: {exc}; give the SGLang command after `--` instead"
        ) from exc
    source.argv = found.argv
    source.env.update(found.env)
    source.read += found.notes
    source.check += found.check


def _enter_container(source: Source) -> None:
    """`docker run … IMAGE python3 -m sglang.launch_server …` → the SGLang command and the container's env."""
    if container_client(source.argv) is None:
        return
    try:
        found = inside(source.argv, source.env)
    except ContainerRefused as exc:
        raise ImportProblem(f"{source.label}: {exc}") from exc
    source.argv, source.env, source.container = found.argv, found.env, found.container
    source.name_hint = source.name_hint or found.container.run.last("--name") or ""
    source.read += found.notes
    source.check += found.check


def _systemd_program(program: str, source: Source) -> str:
    """An ExecStart= program without a directory, found on systemd's fixed search path (not $PATH)."""
    if program.startswith("/"):
        return program
    for directory in SYSTEMD_PATH:
        candidate = Path(directory) / program
        if os.access(candidate, os.X_OK) and candidate.is_file():
            source.read.append(f"program {program} → {candidate} (systemd's search path)")
            return str(candidate)
    source.check.append(f"program {program} is not on systemd's search path here: write its full path")
    return program


def from_command(words: list[str]) -> Source:
    """The server a command line (already split by the shell) starts; leading NAME=value words are its env."""
    env: dict[str, str] = {}
    rest = list(words)
    if rest[:1] == ["env"]:
        rest = rest[1:]
        if rest[:1] and rest[0].startswith("-"):
            raise ImportProblem(f"env {rest[0]}: give only NAME=value assignments before the command")
    while rest and "=" in rest[0] and is_env_name(rest[0].partition("=")[0]):
        name, _, value = rest.pop(0).partition("=")
        env[name] = value
    if not rest:
        raise ImportProblem("no command after the NAME=value assignments")
    source = Source("the command line", "", rest, env)
    _unwrap_shell(source)
    _enter_container(source)
    program = source.argv[0]
    if source.container is not None:
        return source
    if "/" not in program:
        found = shutil.which(program)
        if found:
            source.argv[0] = found
            source.read.append(f"program {program} → {found} (the daemon does not have your shell's PATH)")
        else:
            source.check.append(f"program {program} is not on this PATH: write its full path")
    elif not program.startswith("/"):
        source.argv[0] = str(Path(program).absolute())
        source.read.append(f"program {program} → {source.argv[0]}")
    return source
