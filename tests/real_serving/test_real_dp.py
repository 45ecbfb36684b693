"""One DP rank of a real SGLang server (`--dp-size 2`, tp 1 each, on CPU) stopped with a request routed to it,
under the product's default probe settings: the supervisor names that rank and restarts the server, before the
whole-server lease would have (its `stall_after_s` is 20 s; the rank window 6 s)."""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

from tests.real_serving.support import (
    NO_LOAD_CANARY,
    READY_S,
    SCRIPTED_REASONING,
    InFlight,
    real_deployment,
    serving,
    serving_again,
)
from tests.support.wait import wait_for


def test_a_stopped_dp_rank_is_a_wedge_naming_it_and_the_server_is_restarted(
    tmp_path: Path, serving_python: Path, models: Path
) -> None:
    """DP rank 1's scheduler SIGSTOPped while a request routed to it decodes; DP rank 0 idle (its loop still
    turns): the incident is a `decode_wedge` tagged `dp_rank_wedged` with `dp_rank` 1 (the rank rule decided, not the
    whole-server lease), and the server serves again after a relaunch on rung 1."""
    kw = {"tp": 1, "python": serving_python, "models": models, "model_name": SCRIPTED_REASONING}
    env = {"SGLANG_CPU_OMP_THREADS_BIND": "0|1"}
    with real_deployment(
        tmp_path,
        parsers=("qwen", "qwen3"),
        tuned_probes=False,
        probes=NO_LOAD_CANARY,
        extra_args=["--dp-size", "2"],
        env=env,
        sim_ports=4,
        **kw,
    ) as dep:
        dep.start()
        first = dep.wait(serving, timeout=READY_S, what="serving")
        ranks = dep.ranks(first["pid"])
        assert {"sglang::scheduler_DP0", "sglang::scheduler_DP1", "sglang::data_parallel_controller"} <= set(
            ranks
        )
        with InFlight(dep.sim_url, n=1, routed_dp_rank=1):
            wait_for(lambda: running_on(dep.sim_url, 1), 300, "a request running on DP rank 1", interval=0.2)
            ranks["sglang::scheduler_DP1"].suspend()
            stopped_at = time.time()
            again = serving_again(dep, first["pid"], "relaunched after the DP rank wedge")
        incident = again["last_incident"]
        assert incident["fault"] == "decode_wedge", incident
        evidence = incident["evidence"]
        assert "dp_rank_wedged" in evidence["tags"] and evidence["dp_rank"] == 1, evidence
        assert incident["reason"].startswith("DP rank 1 made no progress"), incident["reason"]
        detected = float(incident["detected_at"]) - stopped_at
        assert again["fallback"]["rung"] == 1 and "--disable-overlap-schedule" in again["argv"]
        print(f"DP rank wedge on the real server: detected {detected:.1f} s after the SIGSTOP")


def running_on(base_url: str, rank: int) -> bool:
    """`/v1/loads` shows a request running on DP rank `rank`."""
    with urllib.request.urlopen(base_url + "/v1/loads", timeout=10) as resp:
        loads = json.loads(resp.read())["loads"]
    return any(e["dp_rank"] == rank and e["num_running_reqs"] >= 1 for e in loads)
