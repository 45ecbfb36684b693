"""PD disaggregation under the supervisor: faults are attributed to the right side and restarts are ordered."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from tests.support.daemon import PdDeployment, Traffic
from tests.support.http import http
from tests.support.ports import free_port
from tests.support.wait import wait_for

Servers = dict[str, dict[str, Any]]
CLI = str(Path(sys.executable).with_name("sglang-supervisor"))


def all_serving(s: Servers) -> bool:
    return all(v["state"] == "serving" for v in s.values())


def test_decode_transfer_wedge_restarts_only_the_decode(tmp_path: Path) -> None:
    """pd_decode_transfer_wedge: pd_transfer_wedge on the decode, decided on the idle prefill; the prefill keeps
    its PID."""
    dep = PdDeployment(tmp_path)  # the default stall window: the idle prefill decides at a quarter of it
    try:
        dep.start()
        first = dep.wait_all(all_serving, what="all serving")
        decode_url = f"http://127.0.0.1:{dep.decode_port}"
        status, _ = dep.post("/sim/fault", {"name": "pd_decode_transfer_wedge"}, base=decode_url)
        assert status == 200
        with Traffic(f"http://127.0.0.1:{dep.router_port}", dep.model, period_s=1.0):
            after = dep.wait_all(
                lambda s: s["decode"]["restarts"] >= 1 and s["decode"]["state"] == "serving",
                timeout=120,
                what="decode recovered",
            )
        incident = after["decode"]["last_incident"]
        assert incident["fault"] == "pd_transfer_wedge"
        assert incident["evidence"]["prefills_idle"] is True, "the prefill sat idle: the KV is not coming"
        assert after["prefill"]["pid"] == first["prefill"]["pid"] and after["prefill"]["restarts"] == 0
        assert after["router"]["pid"] == first["router"]["pid"]
    finally:
        dep.cleanup()


def test_a_relaunched_prefill_proves_the_pair_and_keeps_its_decode(tmp_path: Path) -> None:
    """Prefill SIGKILLed: relaunched and proven by its canary through the pair; the decode (which finds the new
    prefill by itself, as the real one does) keeps its PID and no rung is stepped on it."""
    dep = PdDeployment(tmp_path)
    try:
        dep.start()
        first = dep.wait_all(all_serving, what="all serving")
        os.kill(first["prefill"]["pid"], signal.SIGKILL)
        after = dep.wait_all(
            lambda s: all_serving(s) and s["prefill"]["pid"] != first["prefill"]["pid"],
            timeout=120,
            what="prefill relaunched",
        )
        canary = after["prefill"]["probes"]["probes"]["canary_tool"]
        assert canary["ok"] and not after["prefill"]["unproven"], canary
        assert after["decode"]["pid"] == first["decode"]["pid"] and after["decode"]["restarts"] == 0
        assert after["decode"]["fallback"]["rung"] == 0
        log = (dep.root / "daemon.log").read_text()
        assert '"pd.restart_decode"' not in log, "the decode was not sent after the prefill"
        assert after["router"]["pid"] == first["router"]["pid"]
    finally:
        dep.cleanup()


def test_a_decode_that_keeps_the_old_prefill_is_restarted_after_it(tmp_path: Path) -> None:
    """prefill_replaced_decode_stale: the relaunched prefill's pair stays unproven, so the decode follows."""
    dep = PdDeployment(tmp_path, decode_env={"SGLANG_SIM_SCENARIO": "prefill_replaced_decode_stale"})
    try:
        dep.start()
        first = dep.wait_all(all_serving, what="all serving")
        os.kill(first["prefill"]["pid"], signal.SIGKILL)
        after = dep.wait_all(
            lambda s: all_serving(s) and s["decode"]["pid"] != first["decode"]["pid"],
            timeout=180,
            what="decode restarted",
        )
        assert after["prefill"]["pid"] != first["prefill"]["pid"]
        assert after["router"]["pid"] == first["router"]["pid"]
        assert "prefill" in str(after["decode"]["last_incident"]["reason"])
    finally:
        dep.cleanup()


def test_a_planned_prefill_restart_waits_for_the_decode_to_drop_the_old_prefill(tmp_path: Path) -> None:
    """`restart --server prefill`: the relaunch is held until the decode's heartbeat has surely dropped the old
    prefill (SGLang's 5 s × (2 + 1)); the new prefill is proven through the pair and the decode keeps its PID."""
    dep = PdDeployment(tmp_path)
    try:
        dep.start()
        first = dep.wait_all(all_serving, what="all serving")
        status, body = dep.post("/control/restart", {"server": "prefill", "reason": "test"}, token=dep.token)
        assert status == 200, body
        after = dep.wait_all(
            lambda s: (
                all_serving(s)
                and s["prefill"]["pid"] != first["prefill"]["pid"]
                and not s["prefill"]["unproven"]
            ),
            timeout=120,
            what="prefill replaced and proven",
        )
        assert after["decode"]["pid"] == first["decode"]["pid"] and after["decode"]["restarts"] == 0
        held = [
            line
            for line in (dep.root / "daemon.log").read_text().splitlines()
            if '"pd.relaunch_held"' in line
        ]
        assert held and '"window_s": 15.0' in held[0]
        decode_log = (dep.root / "log" / "decode.log").read_text()
        assert "Lost connection with prefill instance" in decode_log
    finally:
        dep.cleanup()


def test_a_prompt_too_large_for_the_decode_is_aborted_and_the_decode_kept(tmp_path: Path) -> None:
    """real-pd.md §4b on the simulator: a prompt the decode's pool cannot fit blocks its pre-allocation queue with
    /health 200. The decode's requests are aborted (incident `abort`, no restart, no rung, the prefill not blamed
    and untouched) and the pair serves again."""
    dep = PdDeployment(tmp_path, decode_env={"SGLANG_SIM_SCENARIO": "pd_prompt_exceeds_decode_pool"})
    try:
        dep.start()
        first = dep.wait_all(all_serving, what="all serving")
        content = "weather Paris sunny servers GPUs story " * 400
        body = {"model": dep.model, "messages": [{"role": "user", "content": content}], "max_tokens": 16}
        router = f"http://127.0.0.1:{dep.router_port}"
        with ThreadPoolExecutor(1) as pool:
            blocked = pool.submit(http, f"{router}/v1/chat/completions", "POST", body, 120)
            after = dep.wait_all(
                lambda s: (
                    s["decode"]["last_incident"] is not None
                    and s["decode"]["last_incident"]["action"] == "abort"
                ),
                timeout=120,
                what="the decode's requests aborted",
            )
            reply = blocked.result(timeout=60)
        assert reply.status == 500 and b"Aborted by AbortReq." in reply.body
        incident = after["decode"]["last_incident"]
        assert incident["fault"] == "pd_transfer_wedge" and incident["evidence"]["tags"] == [
            "prealloc_blocked"
        ]
        with Traffic(router, dep.model, period_s=0.5) as traffic:
            wait_for(lambda: traffic.sent - traffic.failed >= 3, 60, "requests served through the pair again")
        final = dep.servers()
        for name in ("prefill", "decode"):
            assert final[name]["pid"] == first[name]["pid"] and final[name]["restarts"] == 0, name
            assert final[name]["fallback"]["rung"] == 0, name
    finally:
        dep.cleanup()


def test_a_router_naming_a_bootstrap_port_no_prefill_listens_on_warns_with_sglangs_line(
    tmp_path: Path,
) -> None:
    """Bad input: the router's `--prefill URL PORT` names the wrong bootstrap port, so the decode cannot fetch the
    KV of any request through it. check-config says so; at run time the prefill and decode are proven through
    their own pair, the router serves unproven (awaiting them, then a warning with the decode's own 500 once its
    canaries through them stay inconclusive) and nothing is restarted: no loop on a config error."""
    dep = PdDeployment(tmp_path, router_bootstrap=str(free_port()))
    try:
        dep.write()
        checked = subprocess.run(
            [CLI, "check-config", "--config", str(dep.config_path)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert "the decode cannot fetch the KV, and every request through this router fails" in checked.stderr
        dep.start()
        after = dep.wait_all(
            lambda s: "Decode handshake failed" in (s["router"]["unproven"] or ""),
            timeout=240,
            what="the router's warning",
        )
        assert after["router"]["unproven"].startswith("serving unproven: 3 inconclusive canaries")
        assert all(s["restarts"] == 0 and s["state"] == "serving" for s in after.values()), after
        assert not after["prefill"]["unproven"] and not after["decode"]["unproven"]
        journal = [json.loads(x) for x in (dep.root / "state" / "incidents.jsonl").read_text().splitlines()]
        notices = [i for i in journal if i["fault"] == "canary_unproven"]
        assert [i["server"] for i in notices] == ["router"], notices
    finally:
        dep.cleanup()
