"""A data-parallel server (`--dp-size 2`): one DP rank wedged while the other serves is a wedge of the server with
the rank named (incident, alert reason, forensics with its stacks first); a slow but moving rank is not; the
canaries take each DP rank in turn."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.daemon import Deployment, Traffic, deployment
from tests.support.wait import wait_for

pytestmark = pytest.mark.e2e
DP2 = {"tp": 1, "local_gpus": 2, "extra_args": ["--dp-size", "2"], "sim_ports": 4}


def serving(s: dict[str, Any]) -> bool:
    return s["state"] == "serving"


def scenario(root: Path, name: str, **params: float) -> dict[str, str]:
    path = root / "scenario.toml"
    text = f'[[fault]]\nname = "{name}"\nafter_requests = 4\n[fault.params]\n'
    path.write_text(text + "".join(f"{k} = {v}\n" for k, v in params.items()))
    return {"SGLANG_SIM_SCENARIO": str(path)}


def incidents(dep: Deployment) -> list[dict[str, Any]]:
    journal = dep.root / "state" / "incidents.jsonl"
    lines = journal.read_text().splitlines() if journal.exists() else []
    return [e for e in map(json.loads, lines) if e["fault"] != "operator"]


def test_a_wedged_dp_rank_is_named_and_the_server_restarted_while_its_peer_serves(tmp_path: Path) -> None:
    """DP rank 1 spins with a batch (running, not stopped: no `T` state), DP rank 0 keeps serving the traffic, so
    the summed counters move: the rank's `/v1/loads` snapshot lags, and the server is restarted on its ladder as a
    `decode_wedge` tagged `dp_rank_wedged`, DP rank 1 named in the reason and the evidence, its stacks first."""
    env = scenario(tmp_path, "dp_rank_wedge", dp_rank=1)
    with deployment(tmp_path, env=env, **DP2) as dep:
        dep.start()
        first = dep.wait(serving, timeout=120, what="serving")
        with Traffic(dep.sim_url, dep.model, period_s=0.2):
            dep.wait(lambda s: s["restarts"] >= 1, timeout=90, what="the restart")
        incident = incidents(dep)[0]
        assert incident["fault"] == "decode_wedge", incident
        assert "dp_rank_wedged" in incident["evidence"]["tags"] and incident["evidence"]["dp_rank"] == 1
        assert (
            incident["reason"].startswith("DP rank 1 made no progress for")
            and "while DP0 serves" in incident["reason"]
        )
        assert incident["action"] == "relaunch"
        again = dep.wait(lambda s: serving(s) and s["pid"] != first["pid"], timeout=120, what="serving again")
        assert again["fallback"]["rung"] == 1
        bundle = next((tmp_path / "state" / "forensics").iterdir())
        ranks = list(json.loads((bundle / "summary.json").read_text())["ranks"].values())
        assert "scheduler_DP1" in ranks[0], ranks


def test_a_slow_dp_rank_is_not_a_wedge_and_the_canaries_visit_every_rank(tmp_path: Path) -> None:
    """DP rank 1 steps 130 times slower than DP rank 0 (1.3 s a step, out of phase with the scrapes) under traffic: its snapshot lags, but never
    by the rank window — no incident, same PID; the tool canaries are routed to DP rank 0 and 1 in turn, and pass
    on both."""
    env = scenario(tmp_path, "dp_rank_slow", dp_rank=1, factor=130)
    with deployment(tmp_path, env=env, probes={"canary_period_s": 4}, **DP2) as dep:
        dep.start()
        first = dep.wait(serving, timeout=120, what="serving")
        routed: set[int] = set()
        lags: list[float] = []

        def both_ranks_canaried() -> bool:
            probes = dep.server()["probes"]["probes"]
            values = probes.get("canary_tool", {}).get("values", {})
            if values.get("verdict") == "pass" and "dp_rank" in values:
                routed.add(int(values["dp_rank"]))
            lags.append(
                float(probes.get("dp", {}).get("values", {}).get("ranks", {}).get("1", {}).get("lag_s", 0))
            )
            return routed == {0, 1}

        with Traffic(dep.sim_url, dep.model, period_s=0.2) as traffic:
            assert wait_for(both_ranks_canaried, 180, "a passing canary on each DP rank")
            wait_for(lambda: traffic.sent >= 40, 120, "40 requests")
        assert max(lags) > 0.5, f"DP rank 1 never lagged: {sorted(set(lags))[-3:]}"
        assert incidents(dep) == []
        after = dep.server()
        assert after["pid"] == first["pid"] and after["restarts"] == 0
