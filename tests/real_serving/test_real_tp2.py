"""The daemon against a real tp-2 SGLang server (gloo collectives on CPU) with the scripted reasoning model."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

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


def test_rank_stopped_mid_request_is_a_collective_hang_with_all_reduce_evidence(dep: RealDeployment) -> None:
    """SIGSTOP of scheduler_TP1 with a request decoding: TP0 waits in all_reduce → collective_hang, relaunched."""
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
    assert "all_reduce" in tp0, "py-spy shows TP0 blocked in the collective"
    assert "all_reduce" in json.dumps(incident["evidence"])
    assert "--disable-overlap-schedule" in again["argv"]
