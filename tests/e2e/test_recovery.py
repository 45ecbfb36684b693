"""Recovery policies end to end: fallback ladders, sticky rungs, parser fix, forensics first."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

from tests.support.daemon import Traffic, deployment


def serving(s: dict[str, Any]) -> bool:
    return s.get("state") == "serving"


def test_desync_hang_relaunches_with_disable_overlap_and_stays_cured(tmp_path: Path) -> None:
    """overlap_tp_desync_hang recurring until --disable-overlap-schedule: rung 1 adds it, the fault stays away."""
    scenario = tmp_path / "scenario.toml"
    scenario.write_text(
        '[[fault]]\nname = "overlap_tp_desync_hang"\nafter_requests = 6\nrecur_until_flag = "--disable-overlap-schedule"\n'
    )
    with deployment(tmp_path, env={"SGLANG_SIM_SCENARIO": str(scenario)}, probes={"stall_after_s": 4}) as dep:
        dep.start()
        first = dep.wait(serving, what="serving")
        with Traffic(dep.sim_url, dep.model):
            cured = dep.wait(
                lambda s: serving(s) and s["pid"] != first["pid"], timeout=120, what="relaunched"
            )
        assert "--disable-overlap-schedule" in cured["argv"]
        assert cured["fallback"]["rung"] == 1
        assert (
            "collective_hang" in cured["fallback"]["reason"] or "decode_wedge" in cured["fallback"]["reason"]
        )
        incident = cured["last_incident"]
        assert incident["fault"] in ("collective_hang", "decode_wedge")
        assert "--disable-overlap-schedule" in incident["flags_added"]
        bundle = Path(incident["forensics_path"])
        stacks = {p.name for p in bundle.glob("stack-*.txt")}
        assert {"stack-sglang_scheduler_TP0.txt", "stack-sglang_scheduler_TP1.txt"} <= stacks, (
            "one stack per rank"
        )
        assert json.loads((bundle / "summary.json").read_text())["fault"] == incident["fault"]
        with Traffic(dep.sim_url, dep.model, max_requests=10) as traffic:
            traffic.thread.join(timeout=60)
        state = dep.sim_state()
        assert {"name": "overlap_tp_desync_hang", "cured_by": "--disable-overlap-schedule"} in state[
            "suppressed"
        ]
        assert dep.server()["pid"] == cured["pid"]


def test_oom_twice_steps_mem_fraction_down(tmp_path: Path) -> None:
    """runtime_cuda_oom_crash twice: the second relaunch lowers --mem-fraction-static by one step."""
    scenario = tmp_path / "scenario.toml"
    scenario.write_text('[[fault]]\nname = "runtime_cuda_oom_crash"\nafter_requests = 6\nrecur = true\n')
    with deployment(tmp_path, env={"SGLANG_SIM_SCENARIO": str(scenario)}) as dep:
        dep.start()
        first = dep.wait(serving, what="serving")
        with Traffic(dep.sim_url, dep.model):
            dep.wait(lambda s: s["restarts"] >= 1, timeout=60, what="first oom")
        second = dep.wait(serving, timeout=60, what="first relaunch")
        assert "--mem-fraction-static" not in " ".join(second["argv"]), "a first OOM relaunches unchanged"
        with Traffic(dep.sim_url, dep.model):
            dep.wait(lambda s: s["restarts"] >= 2, timeout=60, what="second oom")
        third = dep.wait(serving, timeout=60, what="second relaunch")
        assert first["pid"] != second["pid"] != third["pid"]
        assert third["last_incident"]["fault"] == "oom"
        assert "--mem-fraction-static=0.83" in third["argv"] or "0.83" in third["argv"]


def test_parser_missing_is_fixed_before_the_first_launch(tmp_path: Path) -> None:
    """Kimi-K2.5 configured without parsers: the first launch already has the kimi_k2 ones — no wasted load."""
    with deployment(tmp_path, parsers=(None, None)) as dep:
        dep.start()
        fixed = dep.wait(serving, timeout=90, what="serving with the family's parsers")
        assert "--tool-call-parser" in " ".join(fixed["argv"]) and "kimi_k2" in fixed["argv"]
        entry = fixed["last_incident"]
        assert entry["fault"] == "parser_misconfig" and entry["action"] == "fixed before launch"
        assert entry["severity"] == "warning" and fixed["restarts"] == 0
        assert fixed["fallback"]["levels"] == {"parser_misconfig": 1}


def test_rung_survives_a_daemon_restart(tmp_path: Path) -> None:
    """The active rung is in state.json: a restarted daemon relaunches with the fallback flag."""
    scenario = tmp_path / "scenario.toml"
    scenario.write_text(
        '[[fault]]\nname = "overlap_tp_desync_hang"\nafter_requests = 6\nrecur_until_flag = "--disable-overlap-schedule"\n'
    )
    with deployment(tmp_path, env={"SGLANG_SIM_SCENARIO": str(scenario)}, probes={"stall_after_s": 4}) as dep:
        daemon = dep.start()
        first = dep.wait(serving, what="serving")
        with Traffic(dep.sim_url, dep.model):
            dep.wait(lambda s: serving(s) and s["pid"] != first["pid"], timeout=120, what="relaunched")
        os.kill(daemon.pid, signal.SIGTERM)
        assert daemon.wait(timeout=60) == 0
        dep.start()
        again = dep.wait(serving, what="serving under the new daemon")
        assert "--disable-overlap-schedule" in again["argv"] and again["fallback"]["rung"] == 1


def test_promote_back_tries_one_rung_lower_and_steps_back_up(tmp_path: Path) -> None:
    """promote_back: stable and quiet → relaunch one rung lower; the fault returns → rung 1 again at once."""
    scenario = tmp_path / "scenario.toml"
    scenario.write_text(
        '[[fault]]\nname = "overlap_tp_desync_hang"\nafter_requests = 6\nrecur_until_flag = "--disable-overlap-schedule"\n'
    )
    env = {"SGLANG_SIM_SCENARIO": str(scenario)}
    policy = {"promote_back": True, "promote_after_s": 3}
    with deployment(tmp_path, env=env, probes={"stall_after_s": 4}, policy=policy) as dep:
        dep.start()
        dep.wait(serving, what="serving")
        with Traffic(dep.sim_url, dep.model):
            cured = dep.wait(lambda s: serving(s) and s["fallback"]["rung"] == 1, timeout=120, what="rung 1")
        promoted = dep.wait(
            lambda s: serving(s) and s["fallback"]["rung"] == 0, timeout=60, what="promoted back"
        )
        assert "--disable-overlap-schedule" not in promoted["argv"] and promoted["pid"] != cured["pid"]
        with Traffic(dep.sim_url, dep.model):
            again = dep.wait(
                lambda s: serving(s) and s["fallback"]["rung"] == 1 and s["pid"] != promoted["pid"],
                timeout=120,
                what="rung 1 again",
            )
        assert again["last_incident"]["fault"] in ("collective_hang", "decode_wedge")


def test_a_rung_the_target_cannot_express_is_skipped_never_launched(tmp_path: Path) -> None:
    """A ladder rung naming a flag the installed server rejects is skipped with a note; the next rung is used."""
    policy = {"ladders": {"crash": [["add --no-such-fallback-flag"], ["add --disable-radix-cache"]]}}
    with deployment(tmp_path, policy=policy) as dep:
        dep.start()
        first = dep.wait(serving, what="serving")
        os.kill(first["pid"], signal.SIGKILL)
        second = dep.wait(lambda s: serving(s) and s["pid"] != first["pid"], what="first relaunch (rung 0)")
        os.kill(second["pid"], signal.SIGKILL)
        third = dep.wait(lambda s: serving(s) and s["pid"] != second["pid"], what="second relaunch")
        assert "--disable-radix-cache" in third["argv"] and "--no-such-fallback-flag" not in third["argv"]
        notes = third["last_incident"]["evidence"]["flag_notes"]
        assert any("crash[0]" in n and "--no-such-fallback-flag" in n for n in notes)
