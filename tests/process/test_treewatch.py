"""The invariant watcher every e2e and real-serving deployment uses sees what it must: two runs of one server alive
at once, a retitled rank through its parent, an orphan through the GPU file it holds, and leftovers."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from supervisor.host.proctree import RUN_MARKER, SERVER_MARKER, server_marker
from tests.support.treewatch import TreeWatch
from tests.support.wait import wait_for

# "simulator" in the command line makes the process a candidate, as the simulator's are
SLEEPER = (
    "import sys, time; f = open(sys.argv[1]) if len(sys.argv) > 1 else None; time.sleep(60)  # simulator"
)


@pytest.fixture
def spawned() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for proc in procs:
        proc.kill()
        proc.wait(timeout=10)


def start(procs: list[subprocess.Popen[bytes]], env: dict[str, str], *args: str) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, "-c", SLEEPER, *args], env={**os.environ, **env})
    procs.append(proc)
    return proc


def test_two_runs_of_one_server_alive_together_are_an_overlap(
    tmp_path: Path, spawned: list[subprocess.Popen[bytes]]
) -> None:
    """Two processes marked with the same server and different run ids: the watch reports the overlap."""
    marker = server_marker("sim", tmp_path / "state")
    watch = TreeWatch(["sim"], tmp_path / "state", {})
    try:
        start(spawned, {SERVER_MARKER: marker, RUN_MARKER: "run-a"})
        wait_for(lambda: len(watch.now()) == 1, 10, "the first run seen")
        assert not watch.overlaps
        start(spawned, {SERVER_MARKER: marker, RUN_MARKER: "run-b"})
        wait_for(lambda: watch.overlaps, 10, "the overlap recorded")
        with pytest.raises(AssertionError, match="two runs of one server"):
            watch.check_one_tree()
        with pytest.raises(AssertionError, match="left after the daemon stopped"):
            watch.check_nothing_left(timeout_s=0.2)
    finally:
        watch.close()


def test_an_orphan_without_a_marker_is_found_by_the_gpu_it_holds(
    tmp_path: Path, spawned: list[subprocess.Popen[bytes]]
) -> None:
    """A process with no readable marker that holds the server's device file is a run of its own beside the
    marked run."""
    device = tmp_path / "nvidia0"
    device.write_text("")
    marker = server_marker("sim", tmp_path / "state")
    watch = TreeWatch(["sim"], tmp_path / "state", {"sim": [device]})
    try:
        start(spawned, {SERVER_MARKER: marker, RUN_MARKER: "run-a"})
        start(spawned, {}, str(device))
        wait_for(lambda: {s.run for s in watch.now()} == {"run-a", "unmarked"}, 10, "both seen")
        wait_for(lambda: watch.overlaps, 10, "the overlap recorded")
    finally:
        watch.close()


def test_another_deployment_of_the_same_name_is_not_watched(
    tmp_path: Path, spawned: list[subprocess.Popen[bytes]]
) -> None:
    """The marker names the deployment (its state dir): another test's server called `sim` is not ours."""
    other = server_marker("sim", tmp_path / "other-state")
    watch = TreeWatch(["sim"], tmp_path / "state", {})
    try:
        proc = start(spawned, {SERVER_MARKER: other, RUN_MARKER: "run-a"})
        wait_for(lambda: proc.pid in {int(p) for p in os.listdir("/proc") if p.isdigit()}, 10, "started")
        assert watch.now() == []
        watch.check_nothing_left(timeout_s=0.2)
    finally:
        watch.close()
