"""An honest status: the running argv against the configured one as flags, one rung per ladder, what the next
launch changes, the document's time, and the screen that shows them."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from policies.ladders import DEFAULT_LADDERS
from policies.states import ServerState
from supervisor.loop.commands import RungChange
from supervisor.reporting.argv_view import diff_words, flag_diff, next_launch, rungs
from supervisor.reporting.status_text import render_status, unreachable
from tests.unit.loop_fakes import FakeClock, FakeHost, daemon, running, until

pytestmark = pytest.mark.unit
S = ServerState

KIMI = [
    "python3", "-m", "sglang.launch_server", "--model-path", "/shared/kimi", "--tp-size", "8",
    "--mem-fraction-static", "0.85", "--speculative-algorithm", "EAGLE3", "--tool-call-parser", "kimi_k2",
    "--api-key", "sk-live-123",
]  # fmt: skip
FELL_BACK = [
    "python3", "-m", "sglang.launch_server", "--model-path", "/shared/kimi", "--tp-size", "8",
    "--mem-fraction-static", "0.75", "--tool-call-parser", "kimi_k2", "--api-key", "sk-live-456",
    "--disable-overlap-schedule",
]  # fmt: skip


def test_flag_diff_names_flags_with_their_values_and_masks_secrets() -> None:
    """Added, removed and changed come as flags with their values (never a bare value), keys masked."""
    diff = flag_diff(KIMI, FELL_BACK)
    assert diff == {
        "added": [["--disable-overlap-schedule", []]],
        "removed": [["--speculative-algorithm", ["EAGLE3"]]],
        "changed": [["--mem-fraction-static", ["0.85"], ["0.75"]]],
    }
    assert "sk-live" not in repr(diff)


def test_diff_words_are_the_fallback_line() -> None:
    """One word per change: `+--flag`, `-(--flag value)`, `~--flag old → new`."""
    words = diff_words(flag_diff(KIMI, FELL_BACK))
    assert "  ".join(words) == (
        "+--disable-overlap-schedule  -(--speculative-algorithm EAGLE3)  ~--mem-fraction-static 0.85 → 0.75"
    )


def test_next_launch_is_pending_only_when_it_differs() -> None:
    """The next launch's diff against the running argv, marked to take effect at the next launch."""
    assert next_launch(KIMI, KIMI)["pending"] is False
    upcoming = next_launch(FELL_BACK, KIMI)
    assert upcoming["pending"] and upcoming["note"] == "takes effect at next launch"
    assert upcoming["added"] == [["--speculative-algorithm", ["EAGLE3"]]]
    assert "***" in upcoming["argv"]


def test_one_rung_entry_per_active_ladder_with_what_it_does() -> None:
    """Two active ladders are two entries, each with its level, its length and its own changes."""
    entries = rungs(KIMI[3:], {"collective_hang": 1, "oom": 2}, DEFAULT_LADDERS)
    assert [(e["key"], e["level"], e["of"]) for e in entries] == [("collective_hang", 1, 3), ("oom", 2, 5)]
    assert entries[0]["added"] == [["--disable-overlap-schedule", []]]
    assert entries[1]["changed"] == [["--mem-fraction-static", ["0.85"], ["0.75"]]]


def body_after_fallback() -> dict[str, Any]:
    entries = rungs(KIMI[3:], {"collective_hang:spec_decode": 1, "oom": 2}, DEFAULT_LADDERS)
    return {
        "status_line": "serving: kimi=serving(collective_hang:spec_decode 1, oom 2)",
        "generated_at": 1.7e9,
        "servers": [
            {
                "name": "kimi", "role": "unified", "state": "serving", "since": 1.7e9 - 30, "pid": 4242,
                "gpus": [0, 1], "restarts": 2, "reason": "health 200 and canary passed",
                "flags": flag_diff(KIMI, FELL_BACK), "next_launch": next_launch(FELL_BACK, FELL_BACK),
                "fallback": {"rung": 2, "levels": {}, "rungs": entries, "ladders": {}},
            }
        ],
    }  # fmt: skip


def test_screen_shows_flags_a_rung_per_ladder_and_the_time() -> None:
    """The screen: the flags as +/-/~ with their values, one RUNG line per ladder, `as of HH:MM:SS`."""
    screen = render_status(body_after_fallback())
    assert re.search(r"as of \d\d:\d\d:\d\d", screen.splitlines()[0])
    assert (
        "  fallback: +--disable-overlap-schedule  -(--speculative-algorithm EAGLE3)  "
        "~--mem-fraction-static 0.85 → 0.75"
    ) in screen
    assert "  RUNG collective_hang:spec_decode 1 of 3: -(--speculative-algorithm EAGLE3)" in screen
    assert "  RUNG oom 2 of 5: ~--mem-fraction-static 0.85 → 0.75" in screen
    assert "next launch" not in screen and "0.85 --" not in screen


def test_unreachable_screen_says_since_when() -> None:
    """While the daemon does not answer, the watch says since when and for how long."""
    text = unreachable(1.7e9, 1.7e9 + 42, "http://127.0.0.1:9", "Connection refused")
    assert re.match(r"daemon unreachable since \d\d:\d\d:\d\d \(42 s\)", text)


def test_the_status_line_names_each_active_ladder(tmp_path: Path) -> None:
    """systemd's STATUS= (and the screen's first line) names each active ladder and its level, not one rung."""
    d = daemon(tmp_path, FakeHost(), FakeClock())
    d.loops[0].owner.set_levels({"oom": 2, "collective_hang": 1})
    assert d.status_line() == "stopped: sim=stopped(collective_hang 1, oom 2)"


async def test_status_document_has_its_time_and_the_configured_argv(tmp_path: Path) -> None:
    """`generated_at` is the document's wall time; a server launched as configured shows no flag difference."""
    host, clock = FakeHost(), FakeClock()
    d = daemon(tmp_path, host, clock)
    async with running(d) as loop:
        await until(lambda: loop.state is S.SERVING)
        doc = d.status_document()
    assert doc["generated_at"] == clock.wall()
    server = doc["servers"][0]
    assert server["configured_argv"] == server["argv"]
    assert (
        server["flags"] == {"added": [], "removed": [], "changed": []} and server["fallback"]["flags"] == []
    )
    assert server["next_launch"]["pending"] is False and server["fallback"]["rungs"] == []
    assert "collective_hang" in server["fallback"]["ladders"]


async def test_a_rung_set_takes_effect_at_the_next_launch_and_is_journaled(tmp_path: Path) -> None:
    """`rung set` changes the next launch only (pending, with who and why in the journal); a restart applies it."""
    host, clock = FakeHost(), FakeClock()
    d = daemon(tmp_path, host, clock)
    async with running(d) as loop:
        await until(lambda: loop.state is S.SERVING)
        result = await d.control_rung("sim", RungChange("collective_hang", 2), "INC-1 try rung 2", "alice")
        assert result["levels"] == {"collective_hang": 2}
        server = loop.status()
        assert server["flags"] == {"added": [], "removed": [], "changed": []}
        assert server["next_launch"]["pending"]
        assert [f for f, _ in server["next_launch"]["added"]] == [
            "--disable-overlap-schedule",
            "--disable-custom-all-reduce",
        ]
        entry = next(i for i in d.svc.incidents.recent if i.fault == "operator")
        assert (entry.action, entry.actor, entry.reason) == (
            "rung collective_hang 2",
            "alice",
            "INC-1 try rung 2",
        )
        assert len(host.runs) == 1
        await d.control("restart", "sim", "apply", "alice")
        await until(lambda: len(host.runs) == 2 and loop.state is S.SERVING)
        assert "--disable-custom-all-reduce" in host.run.argv
        assert loop.status()["fallback"]["flags"] == [
            "+--disable-overlap-schedule",
            "+--disable-custom-all-reduce",
        ]
        assert loop.status()["next_launch"]["pending"] is False
        assert [r["key"] for r in loop.status()["fallback"]["rungs"]] == ["collective_hang"]


async def test_a_rung_reset_with_restart_relaunches_with_the_configured_flags(tmp_path: Path) -> None:
    """`rung reset --restart` puts every ladder back to 0 and relaunches at once (a planned restart)."""
    host, clock = FakeHost(), FakeClock()
    d = daemon(tmp_path, host, clock)
    d.loops[0].owner.set_levels({"collective_hang": 1, "oom": 1})
    async with running(d) as loop:
        await until(lambda: loop.state is S.SERVING)
        assert "--disable-overlap-schedule" in host.run.argv
        await d.control_rung("sim", RungChange(None, 0, restart=True), "root cause fixed", "bob")
        await until(lambda: len(host.runs) == 2 and loop.state is S.SERVING)
    assert loop.owner.levels == {}
    assert "--disable-overlap-schedule" not in host.run.argv
    assert ("collective_hang", 0) in loop.owner.history and ("oom", 0) in loop.owner.history
    actions = [i.action for i in d.svc.incidents.recent if i.fault == "operator"]
    assert actions == ["rung collective_hang 0, oom 0", "restart"]


async def test_a_reload_shows_against_what_runs_and_takes_effect_at_the_next_launch(tmp_path: Path) -> None:
    """After a reload that changes args, `flags` compares the new config with what runs (no stray value) and
    `next_launch` is pending with the change; the relaunch applies it."""
    host, clock = FakeHost(), FakeClock()
    d = daemon(tmp_path, host, clock)
    async with running(d) as loop:
        await until(lambda: loop.state is S.SERVING)
        args = [*loop.cfg.args, "--mem-fraction-static", "0.80"]
        loop.reconfigure(loop.cfg.model_copy(update={"args": tuple(args)}))
        server = loop.status()
        assert server["flags"]["removed"] == [["--mem-fraction-static", ["0.80"]]]
        assert server["next_launch"]["added"] == [["--mem-fraction-static", ["0.80"]]]
        assert server["next_launch"]["note"] == "takes effect at next launch"
        assert "0.80" not in server["argv"] and "0.80" in server["configured_argv"]
        await d.control("restart", "sim", "apply the reload", "alice")
        await until(lambda: len(host.runs) == 2 and loop.state is S.SERVING)
        assert loop.status()["flags"] == {"added": [], "removed": [], "changed": []}
        assert loop.status()["next_launch"]["pending"] is False
