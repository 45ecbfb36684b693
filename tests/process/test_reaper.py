"""Reaper: drain then SIGKILL, group kill, orphans found by marker, foreign holders left alone."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import psutil

from supervisor.host import gpu, launcher, proctree, reaper
from supervisor.host.proctree import ProcId
from tests.process.conftest import Janitor, Tree
from tests.support.wait import wait_for


def _devices(tmp_path: Path, n: int) -> list[Path]:
    paths = []
    for i in range(n):
        path = tmp_path / "dev" / f"nvidia{i}"
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(b"stand-in GPU\n")
        paths.append(path)
    return paths


def _routes(result: reaper.StopResult) -> dict[int, str]:
    return {k.pid: k.route for k in result.killed}


def test_drain_falls_back_to_sigkill_when_sigterm_is_ignored(start_tree: Callable[..., Tree]) -> None:
    """Main ignores SIGTERM: after the grace the group is SIGKILLed and everything is gone."""
    tree = start_tree("--ranks", "2", "--ignore-term")
    result = reaper.stop(tree.main, tree.launched.pgid, tree.run_id, "drain", grace_s=0.3, deadline_s=10)
    assert result.ok, result.reason
    assert result.term_s is None
    assert _routes(result)[tree.main] == "group"
    assert not proctree.find_marked(tree.run_id)
    wait_for(lambda: tree.launched.returncode() == -9, 10, "death by SIGKILL")


def test_drain_sends_sigterm_to_main_only_then_kills_the_rest(start_tree: Callable[..., Tree]) -> None:
    """Main exits on SIGTERM (route term); its ranks, left in the group, are SIGKILLed by group."""
    tree = start_tree("--ranks", "2")
    result = reaper.stop(tree.main, tree.launched.pgid, tree.run_id, "drain", grace_s=10, deadline_s=10)
    assert result.ok, result.reason
    assert result.term_s is not None
    routes = _routes(result)
    assert routes[tree.main] == "term"
    assert all(routes[pid] == "group" for pid in tree.ranks.values())
    wait_for(lambda: tree.launched.returncode() == -15, 10, "death by SIGTERM")


def test_setsid_orphan_found_by_marker_and_device_released(
    tmp_path: Path, start_tree: Callable[..., Tree]
) -> None:
    """A grandchild in its own session, re-parented away from main, is killed via the marker; device freed."""
    devs = _devices(tmp_path, 3)
    tree = start_tree(
        "--ranks", "2", "--hold", str(devs[0]), "--hold", str(devs[1]), "--orphan-hold", str(devs[2])
    )
    assert tree.orphan is not None
    orphan = psutil.Process(tree.orphan)
    assert orphan.ppid() != tree.main and orphan.pid not in {p.pid for p in proctree.descendants(tree.main)}
    assert proctree.proc_id(tree.orphan) is not None
    assert tree.orphan not in proctree.group_members(tree.launched.pgid)
    assert {h.pid for h in gpu.device_holders(devs)} == {*tree.ranks.values(), tree.orphan}
    result = reaper.stop(
        tree.main, tree.launched.pgid, tree.run_id, "kill", grace_s=0, deadline_s=10, device_paths=devs
    )
    assert result.ok, result.reason
    assert _routes(result)[tree.orphan] == "marker"
    assert result.foreign_holders == ()
    verified = gpu.verify_free([0, 1, 2], devs, gpu.NoneBackend(), 1.0, deadline_s=10)
    assert verified.ok, verified.reason


def test_foreign_holder_is_reported_not_killed(
    tmp_path: Path, start_tree: Callable[..., Tree], start_holder: Callable[..., int]
) -> None:
    """A process without our marker holding our device survives the stop, is reported, and blocks verify."""
    devs = _devices(tmp_path, 2)
    tree = start_tree("--ranks", "1", "--hold", str(devs[0]))
    foreign = start_holder(devs[1])
    ident = proctree.proc_id(foreign)
    assert ident is not None
    stale = ProcId(foreign, ident.create_time + 100.0)
    result = reaper.stop(
        tree.main, tree.launched.pgid, tree.run_id, "kill", 0, 10, device_paths=devs, known=[stale]
    )
    assert result.ok, result.reason
    assert [h.pid for h in result.foreign_holders] == [foreign]
    assert "foreign" in result.foreign_holders[0].whose
    assert foreign not in _routes(result)
    assert proctree.is_alive(foreign)
    verified = gpu.verify_free([0, 1], devs, gpu.NoneBackend(), 1.0, deadline_s=0.2)
    assert not verified.ok
    assert (
        f"pid {foreign}" in verified.reason
        and "foreign" in verified.reason
        and str(devs[1]) in verified.reason
    )


def test_allowlisted_process_is_never_signalled(tmp_path: Path, janitor: Janitor) -> None:
    """A dcgm* process carrying our marker, in our group, is spared; the rest of the group is killed."""
    ready = tmp_path / "ready"
    code = (
        "import os, signal, subprocess, sys, setproctitle\n"
        "kid = subprocess.Popen([sys.executable, '-c', 'import signal; signal.pause()'])\n"
        "setproctitle.setproctitle('dcgm-exporter')\n"
        f"open({str(ready)!r}, 'w').write(str(kid.pid))\n"
        "signal.pause()\n"
    )
    janitor.run_ids.append("allow-run")
    handle = launcher.spawn([sys.executable, "-c", code], {}, [0], "allow-run", "unified", tmp_path / "a.log")
    assert isinstance(handle, launcher.Launched)
    janitor.launched.append(handle)
    wait_for(lambda: ready.exists() and ready.read_text() != "", 10, "the ready file")
    kid = int(ready.read_text())
    result = reaper.stop(handle.pid, handle.pgid, "allow-run", "kill", 0, 10)
    assert result.ok, result.reason
    assert _routes(result) == {kid: "group"}
    assert proctree.is_alive(handle.pid)


def test_unknown_mode_is_refused_without_signalling(start_tree: Callable[..., Tree]) -> None:
    """An unknown stop mode returns not ok and leaves the tree running."""
    tree = start_tree("--ranks", "1")
    result = reaper.stop(tree.main, tree.launched.pgid, tree.run_id, "nuke", 0, 1)
    assert not result.ok and "nuke" in result.reason
    assert proctree.is_alive(tree.main)


def test_previous_daemons_run_reaped_by_server_name(start_tree: Callable[..., Tree]) -> None:
    """With PIDs and run id unknown, every process marked with the server name is killed by marker."""
    tree = start_tree("--ranks", "2", server="prev-daemon-srv")
    result = reaper.stop(None, None, "run-of-this-daemon", "kill", 0, 10, server="prev-daemon-srv")
    assert result.ok, result.reason
    assert set(_routes(result)) == {tree.main, *tree.ranks.values()}
    assert set(_routes(result).values()) == {"marker"}
