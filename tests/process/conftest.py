"""Fixtures for process tests: start fixture trees through the launcher and always kill what was started."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from supervisor.host import launcher, proctree
from tests.support.wait import wait_for

FIXTURES = Path(__file__).parent / "fixtures"
READY_TIMEOUT_S = 30.0


@dataclass
class Tree:
    """A running fixture tree: the launcher handle, the PIDs it reported, its run marker."""

    launched: launcher.Launched
    run_id: str
    main: int
    ranks: dict[str, int]
    orphan: int | None


@dataclass
class Janitor:
    """Remembers everything a test started and kills it at teardown, whatever the test did."""

    run_ids: list[str] = field(default_factory=list)
    launched: list[launcher.Launched] = field(default_factory=list)
    popens: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def cleanup(self) -> None:
        for handle in self.launched:
            if handle.pgid not in (os.getpgrp(), 0, 1):
                _kill(handle.pgid, group=True)
        for run_id in self.run_ids:
            for ident in proctree.find_marked(run_id):
                _kill(ident.pid, group=False)
        for proc in self.popens:
            proc.kill()
            proc.wait(timeout=10)
        for handle in self.launched:
            wait_for(partial(_exited, handle), 10, "the launched main process exiting")
            handle.close()
        for run_id in self.run_ids:
            wait_for(partial(_gone, run_id), 10, f"every process of {run_id} gone")


def _exited(handle: launcher.Launched) -> bool:
    return handle.returncode() is not None


def _gone(run_id: str) -> bool:
    return not proctree.find_marked(run_id)


def _kill(pid: int, group: bool) -> None:
    try:
        if group:
            os.killpg(pid, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        return


@pytest.fixture
def janitor() -> Iterator[Janitor]:
    """A janitor whose cleanup runs at teardown."""
    jan = Janitor()
    yield jan
    jan.cleanup()


@pytest.fixture
def start_tree(tmp_path: Path, janitor: Janitor) -> Callable[..., Tree]:
    """Factory: launch ``fixtures/tree.py`` with the given flags under a fresh run marker."""

    def start(*flags: str, server: str = "unified") -> Tree:
        run_id = f"test-{uuid.uuid4().hex[:12]}"
        ready = tmp_path / f"{run_id}.json"
        argv = [sys.executable, str(FIXTURES / "tree.py"), "--ready", str(ready), *flags]
        janitor.run_ids.append(run_id)
        handle = launcher.spawn(argv, {}, [0], run_id, server, tmp_path / f"{run_id}.log")
        assert isinstance(handle, launcher.Launched), handle.reason
        janitor.launched.append(handle)
        wait_for(lambda: ready.exists() or handle.returncode() is not None, READY_TIMEOUT_S, "the tree ready")
        assert ready.exists(), f"tree did not start: {handle.tail(20)}"
        info: dict[str, Any] = json.loads(ready.read_text())
        return Tree(handle, run_id, info["main"], info["ranks"], info["orphan"])

    return start


@pytest.fixture
def start_holder(tmp_path: Path, janitor: Janitor) -> Callable[..., int]:
    """Factory: a process without any run marker holding ``path`` open (or only mapped); returns its PID."""

    def start(path: Path, *flags: str) -> int:
        ready = tmp_path / f"holder-{uuid.uuid4().hex[:8]}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("SGLSUP_")}
        argv = [sys.executable, str(FIXTURES / "hold.py"), str(path), str(ready), *flags]
        proc = subprocess.Popen(argv, env=env, start_new_session=True)
        janitor.popens.append(proc)
        wait_for(lambda: ready.exists() or proc.poll() is not None, READY_TIMEOUT_S, "the holder ready")
        assert ready.exists()
        return proc.pid

    return start
