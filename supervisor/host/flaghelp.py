"""The flags the installed SGLang (or the simulator) accepts, read from its own `--help`, cached on disk.

Running SGLang's `--help` imports the package (seconds), so the parsed option strings are cached as JSON in
`cache_dir`, keyed by the command, the interpreter (path, size, mtime) and the installed SGLang version. The
version is read from the `sglang-*.dist-info` beside the interpreter when there is one (no process started);
otherwise a python command is asked through `importlib.metadata`, and a failure leaves the version out.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from policies.flagcompat import FlagSet, parse_help

MAX_OUTPUT_BYTES = 4 * 1024 * 1024
_TAIL_CHARS = 2000
_VERSION_SCRIPT = "import importlib.metadata as m; print(m.version('sglang'))"
_VERSION_TIMEOUT_S = 30.0
_DIST_INFO = re.compile(r"sglang-([0-9][^-/]*)\.dist-info")


@dataclass(frozen=True)
class HelpUnavailable:
    """Why the target's flags could not be learned (interpreter missing, timeout, non-zero exit...)."""

    reason: str


@dataclass(frozen=True)
class _Done:
    returncode: int
    stdout: str
    stderr: str


def _run(argv: Sequence[str], timeout_s: float) -> _Done | HelpUnavailable:
    """Run argv (no shell) in its own session; output bounded; the whole group is killed on timeout."""
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        try:
            proc = subprocess.Popen(
                list(argv), stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=env, start_new_session=True
            )
        except OSError as exc:
            return HelpUnavailable(f"cannot run {argv[0]}: {exc}")
        try:
            code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return HelpUnavailable(f"{' '.join(argv)} timed out after {timeout_s:g} s")
        texts = []
        for sink in (out, err):
            sink.seek(0)
            texts.append(sink.read(MAX_OUTPUT_BYTES).decode("utf-8", "replace"))
        return _Done(code, texts[0], texts[1])


def _python_of(executable: Path) -> Path | None:
    """The interpreter behind a command: itself if it is a python, else its `#!` line's interpreter."""
    if executable.name.startswith("python"):
        return executable
    try:
        with executable.open("rb") as script:
            first = script.readline(512).decode("utf-8", "replace")
    except OSError:
        return None
    words = first.removeprefix("#!").split() if first.startswith("#!") else []
    return Path(words[0]) if words and words[0].startswith("/") and "python" in Path(words[0]).name else None


def _version(python: Path | None) -> str | None:
    """The SGLang version installed for this interpreter, or None when it cannot be told."""
    if python is None:
        return None
    for site in python.parent.parent.glob("lib/python*/site-packages"):
        found = sorted(
            m.group(1) for p in site.glob("sglang-*.dist-info") if (m := _DIST_INFO.fullmatch(p.name))
        )
        if found:
            return found[-1]
    done = _run([str(python), "-c", _VERSION_SCRIPT], _VERSION_TIMEOUT_S)
    if isinstance(done, _Done) and done.returncode == 0 and done.stdout.strip():
        return done.stdout.strip().splitlines()[-1]
    return None


def sglang_version(command: Sequence[str]) -> str | None:
    """The SGLang version a server's command runs (None when it cannot be told)."""
    found = shutil.which(command[0]) if command else None
    return _version(_python_of(Path(os.path.abspath(found)))) if found else None


def _cache_key(command: Sequence[str], executable: Path) -> str:
    stat = executable.stat()
    material = {
        "command": list(command[1:]),
        "interpreter": str(executable),
        "mtime_ns": stat.st_mtime_ns,
        "size": stat.st_size,
        "version": _version(_python_of(executable)),
    }
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()


def _read_cache(path: Path, key: str) -> FlagSet | None:
    try:
        entry = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(entry, dict) or entry.get("key") != key or not isinstance(entry.get("options"), list):
        return None
    return FlagSet(frozenset(str(o) for o in entry["options"]))


def _write_cache(path: Path, key: str, command: Sequence[str], flags: FlagSet) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    entry = {"key": key, "command": list(command), "options": sorted(flags.options)}
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".flags-", suffix=".json")
    with os.fdopen(fd, "w", encoding="utf-8") as sink:
        json.dump(entry, sink)
    os.replace(tmp, path)


def target_flags(
    command: Sequence[str], cache_dir: Path, timeout_s: float = 120.0
) -> FlagSet | HelpUnavailable:
    """The options `command --help` lists (e.g. `[python, "-m", "sglang.launch_server"]`), cached in `cache_dir`."""
    if not command:
        return HelpUnavailable("empty command")
    found = shutil.which(command[0])
    if found is None:
        return HelpUnavailable(f"interpreter not found: {command[0]}")
    executable = Path(os.path.abspath(found))
    try:
        key = _cache_key(command, executable)
    except OSError as exc:
        return HelpUnavailable(f"cannot inspect {executable}: {exc}")
    path = cache_dir / f"flags-{key[:24]}.json"
    cached = _read_cache(path, key)
    if cached is not None:
        return cached
    done = _run([str(executable), *command[1:], "--help"], timeout_s)
    if isinstance(done, HelpUnavailable):
        return done
    if done.returncode != 0:
        return HelpUnavailable(
            f"{' '.join(command)} --help exited {done.returncode}: {done.stderr[-_TAIL_CHARS:]}"
        )
    flags = parse_help(done.stdout)
    if not flags.options:
        return HelpUnavailable(f"{' '.join(command)} --help listed no options")
    with contextlib.suppress(OSError):
        _write_cache(path, key, command, flags)
    return flags


TRANSFER_MODULES = {"mooncake": "mooncake", "mooncake_tcp": "mooncake", "nixl": "nixl"}  # backend → import


def missing_transfer_module(command: Sequence[str], backend: str, timeout_s: float = 60.0) -> str | None:
    """The module SGLang imports at start for PD `backend` when the target's interpreter cannot find it (None when
    it can, when the backend needs none we know of, or when the command is not a python running SGLang)."""
    module = TRANSFER_MODULES.get(backend)
    if module is None or "sglang.launch_server" not in command or "python" not in Path(command[0]).name:
        return None
    script = f"import importlib.util, sys; sys.exit(0 if importlib.util.find_spec({module!r}) else 3)"
    done = _run([command[0], "-c", script], timeout_s)
    return module if isinstance(done, _Done) and done.returncode == 3 else None
