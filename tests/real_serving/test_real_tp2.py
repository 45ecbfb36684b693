"""The daemon against a real tp-2 SGLang server (gloo collectives on CPU) with the scripted reasoning model."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from probes.stacks import IDLE, classify, parse_dump
from tests.real_serving.support import (
    READY_S,
    SCRIPTED_REASONING,
    InFlight,
    RealDeployment,
    real_deployment,
    serving,
    wait_running,
)


@pytest.fixture(scope="module")
def dep(
    tmp_path_factory: pytest.TempPathFactory, serving_python: Path, models: Path
) -> Iterator[RealDeployment]:
    """The real tp-2 deployment with the family's parsers (qwen, qwen3), its daemon started."""
    root = tmp_path_factory.mktemp("real-tp2")
    kw = {"tp": 2, "python": serving_python, "models": models, "model_name": SCRIPTED_REASONING}
    with real_deployment(root, parsers=("qwen", "qwen3"), **kw) as d:
        d.start()
        yield d


def test_tp2_serves_with_both_canaries_passing(dep: RealDeployment) -> None:
    """tp 2 reaches serving: ranks titled TP0/TP1, config check, reasoning and tool canaries all pass."""
    s = dep.wait(serving, timeout=READY_S, what="serving")
    probes = s["probes"]["probes"]
    for name in ("config_check", "canary_reasoning", "canary_tool"):
        assert probes[name]["values"]["verdict"] == "pass", probes[name]
    assert dep.ranks(s["pid"]).keys() >= {
        "sglang::scheduler_TP0",
        "sglang::scheduler_TP1",
        "sglang::detokenizer",
    }
    assert s["restarts"] == 0


def test_rank_stopped_mid_request_is_a_collective_hang_with_collective_evidence(dep: RealDeployment) -> None:
    """SIGSTOP of scheduler_TP1 with a request decoding: TP0 waits in a collective → collective_hang, relaunched.

    Which collective TP0 waits in depends on where the stop lands: mostly the forward's `all_reduce`, sometimes the
    `broadcast` of the next requests between two decode steps (seen in CI). Both are a peer that never comes.
    """
    first = dep.wait(serving, timeout=READY_S, what="serving")
    with InFlight(dep.sim_url, n=1):
        wait_running(dep.sim_url, 1, timeout=300)
        dep.ranks(first["pid"])["sglang::scheduler_TP1"].suspend()
        again = dep.wait(
            lambda s: serving(s) and s["pid"] != first["pid"],
            timeout=READY_S,
            what="relaunched after the hang",
        )
    incident = again["last_incident"]
    assert incident["fault"] == "collective_hang", incident
    bundle = Path(incident["forensics_path"])
    tp0 = (bundle / "stack-sglang_scheduler_TP0.txt").read_text()
    collective, frame = classify(parse_dump(tp0)[0])
    assert collective is not None and collective != IDLE, f"py-spy shows TP0 blocked in a collective:\n{tp0}"
    assert collective in json.dumps(incident["evidence"]), (collective, frame, incident["evidence"])
    assert "--disable-overlap-schedule" in again["argv"]


def test_a_sigkilled_daemon_is_followed_by_one_that_adopts_the_real_tree(dep: RealDeployment) -> None:
    """The daemon SIGKILLed while the real tp-2 server serves: the next daemon adopts the same tree (its main PID,
    no incident), and a real rank kill afterwards is still caught: a crash, the relaunch spawned (the module's last
    test: the relaunch's own start is not waited for)."""
    first = dep.wait(serving, timeout=READY_S, what="serving")
    incidents = len(dep.incidents())
    assert dep.daemon is not None
    os.killpg(dep.daemon.pid, signal.SIGKILL)
    dep.daemon.wait(timeout=30)
    dep.start()
    adopted = dep.wait(lambda s: serving(s) and bool(s["adopted"]), timeout=READY_S, what="adopted")
    assert adopted["pid"] == first["pid"] and len(dep.incidents()) == incidents
    dep.ranks(first["pid"])["sglang::scheduler_TP1"].kill()
    again = dep.wait(
        lambda s: s["pid"] not in (None, first["pid"]) and bool(s["last_incident"]),
        timeout=READY_S,
        what="the relaunch spawned after the rank kill",
    )
    assert again["last_incident"]["fault"] == "crash" and not again["adopted"]
