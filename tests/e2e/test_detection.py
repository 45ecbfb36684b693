"""Detection through the daemon: spins, slow but progressing startups, leaks that appear only under load."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.support.daemon import deployment


def serving(s: dict[str, Any]) -> bool:
    return s.get("state") == "serving"


def test_spin_is_a_collective_hang_and_an_incurable_one_walks_the_ladder_to_failed(tmp_path: Path) -> None:
    """custom_allreduce_spin recurring whatever the flags: collective_hang with GPU spin evidence, rungs 1-2-3, failed."""
    scenario = tmp_path / "scenario.toml"
    scenario.write_text(
        '[[fault]]\nname = "custom_allreduce_spin_sigterm_immune"\nafter_requests = 2\nrecur = true\n'
    )
    env = {"SGLANG_SIM_SCENARIO": str(scenario)}
    restart = {"restarts": 10, "initial_s": 0.2, "factor": 2, "max_s": 5, "jitter": 0}
    with deployment(tmp_path, env=env, probes={"stall_after_s": 4}, restart=restart) as dep:
        dep.start()
        failed = dep.wait(lambda s: s["state"] == "failed", timeout=240, what="failed after the ladder")
        assert failed["fallback"]["rung"] == 3
        assert "ladder exhausted" in failed["reason"]
        lines = (tmp_path / "state" / "incidents.jsonl").read_text().splitlines()
        first = json.loads(lines[0])
        assert first["fault"] == "collective_hang"
        assert first["evidence"]["gpu_spin"] == [0, 1], "the incident carries the GPU spin evidence"
        assert failed["last_incident"]["severity"] == "page"
        text = dep.log_tail(600)
        delays = [
            float(line.split("relaunch in ")[1].split("s")[0])
            for line in text.splitlines()
            if "relaunch in " in line
        ]
        assert len(delays) == 3 and delays == sorted(delays), "backoff grows between the rungs"


def test_slow_startup_with_progress_lines_is_not_a_fault(tmp_path: Path) -> None:
    """slow_startup_deepgemm: a long JIT startup that keeps logging progress reaches serving with no incident."""
    scenario = tmp_path / "scenario.toml"
    scenario.write_text(
        '[[fault]]\nname = "slow_startup_deepgemm"\non_start = true\n[fault.params]\nstartup_s = 12\n'
    )
    with deployment(tmp_path, env={"SGLANG_SIM_SCENARIO": str(scenario)}) as dep:
        text = dep.config_path.read_text().replace("startup_silence_s = 60", "startup_silence_s = 5")
        dep.config_path.write_text(text)
        dep.start()
        up = dep.wait(serving, timeout=90, what="serving after a slow startup")
        assert up["restarts"] == 0 and up["last_incident"] is None


def test_stream_leak_under_load_is_degraded_and_never_restarted(tmp_path: Path) -> None:
    """tool_markup_leak_under_load: the concurrent stream canary sees the leak → degraded, an alert, no restart."""
    probes = {"stream_canary_concurrency": 32, "stream_canary_period_s": 3, "canary_period_s": 3}
    with deployment(
        tmp_path, env={"SGLANG_SIM_SCENARIO": "tool_markup_leak_under_load"}, probes=probes
    ) as dep:
        dep.start()
        first = dep.wait(serving, what="serving")
        degraded = dep.wait(lambda s: s["state"] == "degraded", timeout=90, what="degraded")
        assert degraded["last_incident"]["fault"] == "stream_leak"
        assert degraded["last_incident"]["action"] == "alert"
        assert degraded["restarts"] == 0 and degraded["pid"] == first["pid"]
