"""A shell wrapper around SGLang's command (`bash -c 'source /opt/venv/bin/activate && exec python -m …'`), unwrapped.

Many units start SGLang through a shell to activate a venv first. The supervisor runs the command itself, so the
import reads the script when it is a plain sequence (`&&` or `;`) of commands the supervisor does not need —
`source`/`.` of a venv's `bin/activate` (the program is then that venv's), `cd DIR`, `export NAME=value`,
`NAME=value` — followed by the server's command (`exec` optional, `NAME=value` words before it are its
environment). `$NAME` and `${NAME}` are replaced from the environment the unit gives the shell. Anything else a
shell does (pipes, redirections, `||`, `$(…)`, conditionals) is refused with a message: give the command after
`--` instead.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field

SHELLS = {"sh", "bash", "dash", "zsh"}
_SCRIPT_FLAGS = {"-c", "-lc", "-ec", "-ic"}
_SEPARATORS = {"&&", ";"}
_VARIABLE = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))")
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


class ShellScriptRefused(ValueError):
    """A script that does more than prepare and start one command."""


@dataclass
class Unwrapped:
    """The command a shell wrapper runs, the environment it adds, and what was dropped (for the summary)."""

    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    check: list[str] = field(default_factory=list)


def is_wrapper(argv: list[str]) -> bool:
    """True for `sh|bash|dash|zsh -c SCRIPT`."""
    return len(argv) >= 3 and argv[0].rsplit("/", 1)[-1] in SHELLS and argv[1] in _SCRIPT_FLAGS


def _commands(script: str) -> list[list[str]]:
    lexer = shlex.shlex(script, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    commands: list[list[str]] = [[]]
    for token in lexer:
        if token in _SEPARATORS:
            commands.append([])
        elif token and set(token) <= set("|&<>();"):
            raise ShellScriptRefused(f"the script uses {token!r}")
        elif "$(" in token or "`" in token:
            raise ShellScriptRefused("the script uses command substitution")
        else:
            commands[-1].append(token)
    return [c for c in commands if c]


def unwrap(argv: list[str], env: dict[str, str]) -> Unwrapped:
    """The server's command inside `sh -c SCRIPT` (see the module docstring); ShellScriptRefused otherwise."""
    commands = _commands(argv[2])
    if not commands:
        raise ShellScriptRefused("the script is empty")
    out = Unwrapped([])
    known = dict(env)
    venv_bin: str | None = None
    for words in commands[:-1]:
        verb = words[0]
        if verb in ("source", ".") and len(words) == 2:
            if words[1].endswith("/bin/activate"):
                venv_bin = words[1].removesuffix("/activate")
            out.notes.append(
                f"shell wrapper: `{' '.join(words)}` dropped (the program is written with its path)"
            )
        elif verb == "cd" and len(words) == 2:
            out.check.append(f"shell wrapper: `cd {words[1]}` dropped: make relative paths in args absolute")
        elif verb == "export" or all(_ASSIGNMENT.match(w) for w in words):
            for word in words[1:] if verb == "export" else words:
                name, _, value = word.partition("=")
                out.env[name] = known[name] = _expand(value, known, out)
        else:
            raise ShellScriptRefused(f"the script runs `{' '.join(words)}` before the server")
    last = commands[-1]
    while last and (last[0] == "exec" or _ASSIGNMENT.match(last[0])):
        word = last.pop(0)
        if word != "exec":
            name, _, value = word.partition("=")
            out.env[name] = known[name] = _expand(value, known, out)
    if not last:
        raise ShellScriptRefused("the script starts no command")
    out.argv = [_expand(word, known, out) for word in last]
    if venv_bin and "/" not in out.argv[0]:
        out.argv[0] = f"{venv_bin}/{out.argv[0]}"
        out.notes.append(f"shell wrapper: {last[0]} is the activated venv's: {out.argv[0]}")
    out.notes.append(
        f"shell wrapper `{argv[0]} {argv[1]} …` unwrapped: the supervisor starts the command itself"
    )
    return out


def _expand(word: str, env: dict[str, str], out: Unwrapped) -> str:
    """`$NAME` and `${NAME}` replaced from `env` (as one word); an unknown one is left and reported."""

    def value(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        if name in env:
            return env[name]
        out.check.append(f"shell wrapper: ${name} is not set by the unit; left as written")
        return match.group(0)

    return _VARIABLE.sub(value, word)
