"""target_flags: learning a server's flags from its own --help, with an on-disk cache."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from policies.flagcompat import FlagSet
from simulator.cli import build_parser
from supervisor.host import flaghelp
from supervisor.host.flaghelp import HelpUnavailable, target_flags

SIMULATOR = [sys.executable, "-m", "simulator.launch_server"]


def simulator_options() -> frozenset[str]:
    return frozenset(
        o for a in build_parser()._actions if a.help != argparse.SUPPRESS for o in a.option_strings
    )


def test_simulator_help_gives_its_flags(tmp_path: Path) -> None:
    """The simulator's --help yields exactly the option strings its parser accepts."""
    flags = target_flags(SIMULATOR, tmp_path)
    assert isinstance(flags, FlagSet)
    assert flags.options == simulator_options()
    assert flags.accepts("--cuda-graph-backend-decode")
    assert len(list(tmp_path.glob("flags-*.json"))) == 1


def test_second_call_uses_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cached entry is reused: the second call never runs --help."""
    first = target_flags(SIMULATOR, tmp_path)
    assert isinstance(first, FlagSet)
    real_run = flaghelp._run
    runs: list[Sequence[str]] = []

    def no_help(argv: Sequence[str], timeout_s: float) -> object:
        runs.append(argv)
        if "--help" in argv:
            raise AssertionError(f"--help ran despite the cache: {argv}")
        return real_run(argv, timeout_s)

    monkeypatch.setattr(flaghelp, "_run", no_help)
    assert target_flags(SIMULATOR, tmp_path) == first
    assert not any("--help" in argv for argv in runs)


def test_cache_key_includes_the_command(tmp_path: Path) -> None:
    """Another module of the same interpreter is not served the cached simulator flags."""
    assert isinstance(target_flags(SIMULATOR, tmp_path), FlagSet)
    other = target_flags([sys.executable, "-m", "simulator.launch_router"], tmp_path)
    assert other != target_flags(SIMULATOR, tmp_path)
    assert len(list(tmp_path.glob("flags-*.json"))) == 2


def test_corrupt_cache_is_ignored(tmp_path: Path) -> None:
    """A cache file that is not valid JSON is replaced by a fresh reading."""
    first = target_flags(SIMULATOR, tmp_path)
    (cached,) = tmp_path.glob("flags-*.json")
    cached.write_text("{not json")
    assert target_flags(SIMULATOR, tmp_path) == first


def test_missing_interpreter_is_unavailable(tmp_path: Path) -> None:
    """A command whose interpreter does not exist gives HelpUnavailable with a reason."""
    result = target_flags([str(tmp_path / "no-python"), "-m", "sglang.launch_server"], tmp_path)
    assert isinstance(result, HelpUnavailable)
    assert "not found" in result.reason


def test_failing_help_is_unavailable_with_stderr(tmp_path: Path) -> None:
    """A --help that exits non-zero gives HelpUnavailable carrying the stderr tail, and nothing is cached."""
    result = target_flags([sys.executable, "-m", "no_such_module_xyz"], tmp_path / "cache")
    assert isinstance(result, HelpUnavailable)
    assert "no_such_module_xyz" in result.reason
    assert not (tmp_path / "cache").exists()


def test_help_timeout_is_unavailable(tmp_path: Path) -> None:
    """A --help that hangs is killed at the timeout and reported."""
    script = tmp_path / "hang.py"
    script.write_text("import threading\nthreading.Event().wait()\n")
    result = target_flags([sys.executable, str(script)], tmp_path, timeout_s=0.5)
    assert isinstance(result, HelpUnavailable)
    assert "timed out" in result.reason
