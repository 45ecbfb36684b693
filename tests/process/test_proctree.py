"""Process tree: titles, group, descendants, run marker, and noticing a main or rank death."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable

from supervisor.host import proctree
from supervisor.host.proctree import TreeEvent, TreeSnapshot, expected_rank_titles
from tests.process.conftest import Tree
from tests.support.wait import wait_for


def test_tree_found_by_group_descendants_and_marker(start_tree: Callable[..., Tree]) -> None:
    """Main and ranks are found by process group, by descent from main, and by the run marker."""
    tree = start_tree("--ranks", "2", "--detokenizer", server="prefill-x")
    ranks = set(tree.ranks.values())
    assert tree.launched.pgid == tree.main != os.getpgrp()
    assert ranks | {tree.main} <= set(proctree.group_members(tree.launched.pgid))
    assert ranks <= {p.pid for p in proctree.descendants(tree.main)}
    assert ranks | {tree.main} <= {p.pid for p in proctree.find_marked(tree.run_id)}
    assert ranks <= {p.pid for p in proctree.find_marked(server="prefill-x")}
    assert not proctree.find_marked(run_id=tree.run_id, server="another-server")


def test_snapshot_maps_each_title_to_its_pid(start_tree: Callable[..., Tree]) -> None:
    """A healthy tree: main alive, every expected title running with CPU times, no crash."""
    tree = start_tree("--ranks", "2", "--detokenizer")
    snap = proctree.snapshot(tree.main, tree.run_id, expected_rank_titles(2))
    assert snap.main_alive and not snap.crashed
    assert {r.title: r.pid for r in snap.ranks} == tree.ranks
    assert all(r.status == "running" and r.cpu_time_s is not None for r in snap.ranks)


def test_killed_rank_shows_as_lost_while_main_lives(start_tree: Callable[..., Tree]) -> None:
    """A SIGKILLed rank is a zombie after a previous snapshot, missing without one; main alive = crash."""
    tree = start_tree("--ranks", "2", "--detokenizer")
    titles = expected_rank_titles(2)
    first, _ = proctree.poll_tree(None, tree.main, tree.run_id, titles)
    os.kill(tree.ranks["sglang::scheduler_TP1"], signal.SIGKILL)
    seen: list[tuple[TreeSnapshot, list[TreeEvent]]] = []

    def lost() -> bool:
        seen.append(proctree.poll_tree(first, tree.main, tree.run_id, titles))
        return seen[-1][0].crashed

    wait_for(lost, 10, "the rank shown as lost")
    snap, events = seen[-1]
    assert [r.title for r in snap.lost_ranks] == ["sglang::scheduler_TP1"]
    assert snap.lost_ranks[0].status == "zombie"
    assert events == [TreeEvent("rank_lost", tree.ranks["sglang::scheduler_TP1"], "sglang::scheduler_TP1")]
    fresh = proctree.snapshot(tree.main, tree.run_id, titles)
    assert [r.status for r in fresh.lost_ranks] == ["missing"]


def test_polls_between_full_scans_still_see_a_rank_die(start_tree: Callable[..., Tree]) -> None:
    """Between full scans a poll reads only the known PIDs, and a rank killed then is lost at the next poll."""
    tree = start_tree("--ranks", "2", "--detokenizer")
    titles = expected_rank_titles(2)
    first, _ = proctree.poll_tree(None, tree.main, tree.run_id, titles)
    second, events = proctree.poll_tree(first, tree.main, tree.run_id, titles)
    assert second.scanned_at == first.scanned_at and not events and not second.crashed
    os.kill(tree.ranks["sglang::scheduler_TP0"], signal.SIGKILL)
    seen: list[tuple[TreeSnapshot, list[TreeEvent]]] = []

    def lost() -> bool:
        seen.append(proctree.poll_tree(second, tree.main, tree.run_id, titles))
        return seen[-1][0].crashed

    wait_for(lost, 10, "the rank shown as lost")
    snap, events = seen[-1]
    assert snap.scanned_at > first.scanned_at
    assert events == [TreeEvent("rank_lost", tree.ranks["sglang::scheduler_TP0"], "sglang::scheduler_TP0")]


def test_main_death_is_seen_by_the_first_poll_after_it(start_tree: Callable[..., Tree]) -> None:
    """Once main is dead, the very next poll reports main_exited (latency ≤ one poll interval)."""
    tree = start_tree("--ranks", "2")
    before, _ = proctree.poll_tree(None, tree.main, tree.run_id)
    os.kill(tree.main, signal.SIGKILL)
    wait_for(lambda: tree.launched.returncode() is not None, 10, "the main process exiting")
    after, events = proctree.poll_tree(before, tree.main, tree.run_id)
    assert not after.main_alive
    assert TreeEvent("main_exited", tree.main) in events
    assert set(tree.ranks.values()) <= {p.pid for p in after.marked}


def test_a_stopped_rank_shows_its_state_letter_in_full_and_quick_snapshots(
    start_tree: Callable[..., Tree],
) -> None:
    """SIGSTOP of a rank: its state letter reads `T` in a full scan and in the quick reads between scans."""
    tree = start_tree("--ranks", "2", "--detokenizer")
    titles = expected_rank_titles(2)
    pid = tree.ranks["sglang::scheduler_TP1"]
    os.kill(pid, signal.SIGSTOP)
    try:

        def state(snap: TreeSnapshot) -> str | None:
            return next(r.state for r in snap.ranks if r.title == "sglang::scheduler_TP1")

        wait_for(
            lambda: state(proctree.snapshot(tree.main, tree.run_id, titles)) == "T", 10, "T in a full scan"
        )
        full = proctree.snapshot(tree.main, tree.run_id, titles)
        quick = proctree.quick_snapshot(tree.main, titles, full)
        assert quick is not None and state(quick) == "T"
        assert {r.state for r in full.ranks if r.title != "sglang::scheduler_TP1"} <= {"R", "S"}
    finally:
        os.kill(pid, signal.SIGCONT)
