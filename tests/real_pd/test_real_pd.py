"""The daemon supervising the real PD pair behind SMG in PD mode, shared by the tests of this module in file order:
each starts from both proven and in SMG, and leaves them so again (each fault costs one or two real relaunches).

The pair: the real SGLang 0.5.23 prefill and decode on CPU, the KV moved by Mooncake over TCP (real-pd.md). The
daemon proves each by a canary through the pair and drives SMG's membership (`[gateway]`).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.gateway.support import ts
from tests.real_pd.support import (
    LONG_PROMPT,
    Chats,
    RealPdDeployment,
    pair_chat,
    pd_queue,
    real_pd_deployment,
)
from tests.real_serving.support import READY_S
from tests.support.gateways import post_chat
from tests.support.wait import wait_for

Servers = dict[str, dict[str, Any]]


@pytest.fixture(scope="module")
def pd(tmp_path_factory: pytest.TempPathFactory, pd_python: Path, models: Path) -> Iterator[RealPdDeployment]:
    root = tmp_path_factory.mktemp("real-pd")
    with real_pd_deployment(root, pd_python, models) as dep:
        dep.start()
        yield dep


def proven(s: Servers) -> bool:
    return all(s[n]["state"] == "serving" and not s[n].get("unproven") for n in ("prefill", "decode"))


def in_gateway(dep: RealPdDeployment) -> bool:
    assert dep.gateway is not None
    live = dep.gateway.live()
    return all(url in live for url in dep.urls.values())


def ready(dep: RealPdDeployment, what: str) -> Servers:
    """Both proven, both in SMG, a chat through SMG answered: the pair serves."""
    servers = dep.wait_all(proven, READY_S, f"{what}: prefill and decode proven")
    wait_for(lambda: in_gateway(dep), 120, f"{what}: both in SMG")
    assert dep.gateway is not None
    assert post_chat(dep.gateway.url, str(dep.model_dir), stream=False, timeout_s=120) == "ok"
    return servers


def test_each_server_is_proven_through_the_pair_and_joins_smg(pd: RealPdDeployment) -> None:
    """A prefill refuses a request without a bootstrap room: each is proven by a canary sent to both with one,
    and joins SMG only once proven (SMG lists the prefill with its bootstrap port)."""
    servers = ready(pd, "first launch")
    for name in ("prefill", "decode"):
        canary = servers[name]["probes"]["probes"]["canary_tool"]
        assert canary["ok"] and canary["values"]["verdict"] == "pass", canary
        assert servers[name]["restarts"] == 0
    assert not [i for i in pd.incidents() if i["fault"] == "canary_unproven"]
    added = {e["server"]: ts(e) for e in pd.events("gateway.added")}
    assert set(added) == {"prefill", "decode"}
    assert pd.gateway is not None
    listed = {w["url"]: w for w in pd.gateway.workers()}
    assert listed[pd.urls["prefill"]]["worker_type"] == "prefill"
    assert listed[pd.urls["prefill"]]["bootstrap_port"] == pd.boot


def test_a_stopped_prefill_is_restarted_and_the_waiting_decode_left_alone(pd: RealPdDeployment) -> None:
    """Prefill scheduler SIGSTOPped under load through SMG: the decode's requests wait for KV with its /health
    200 — the prefill is named and restarted, the decode keeps its PID, no incident and no rung; SGLang itself
    fails the decode's requests bound to the dead prefill (its heartbeat), and the pair serves again."""
    first = ready(pd, "before")
    decode_pid, incidents = first["decode"]["pid"], len(pd.incidents())
    assert pd.gateway is not None
    with Chats(pd.gateway.url, str(pd.model_dir)) as chats:
        wait_for(lambda: chats.ok() >= 2, 120, "requests through the pair")
        stopped_at = time.time()
        pd.ranks("prefill")["sglang::scheduler"].suspend()
        after = pd.wait_all(
            lambda s: s["prefill"]["pid"] != first["prefill"]["pid"] and proven(s),
            READY_S,
            "prefill relaunched",
        )
    new = pd.incidents()[incidents:]
    assert {i["server"] for i in new if i["fault"] != "canary_unproven"} == {"prefill"}, new
    fault = after["prefill"]["last_incident"]
    assert fault["detected_at"] > stopped_at, fault  # how soon: benchmarks/bench_pd.py (30-61 s seen)
    assert after["decode"]["pid"] == decode_pid and after["decode"]["restarts"] == first["decode"]["restarts"]
    assert after["decode"]["fallback"]["rung"] == 0 and not pd.events("pd.restart_decode")
    wait_for(lambda: pd_queue(pd.urls["decode"]) == 0, 60, "the decode's queue drained")
    ready(pd, "after")


def test_a_stopped_decode_gets_a_decode_only_restart(pd: RealPdDeployment) -> None:
    """Decode scheduler SIGSTOPped under load: the decode is restarted, the prefill keeps its PID."""
    first = ready(pd, "before")
    assert pd.gateway is not None
    with Chats(pd.gateway.url, str(pd.model_dir)) as chats:
        wait_for(lambda: chats.ok() >= 2, 120, "requests through the pair")
        pd.ranks("decode")["sglang::scheduler"].suspend()
        after = pd.wait_all(
            lambda s: s["decode"]["pid"] != first["decode"]["pid"] and proven(s), READY_S, "decode relaunched"
        )
    assert after["decode"]["last_incident"]["server"] == "decode"
    assert after["prefill"]["pid"] == first["prefill"]["pid"]
    assert after["prefill"]["restarts"] == first["prefill"]["restarts"]
    ready(pd, "after")


def test_both_killed_relaunch_once_each_and_join_smg_only_when_the_pair_is_proven(
    pd: RealPdDeployment,
) -> None:
    """Prefill and decode SIGKILLed together: both relaunched at once, each once (the decode not again after the
    prefill: it needs no prefill to start, each request names its bootstrap), and neither back in SMG before the
    pair's canary passed on it."""
    first = ready(pd, "before")
    killed_at = time.time()
    for name in ("prefill", "decode"):
        os.kill(first[name]["pid"], signal.SIGKILL)
    after = pd.wait_all(
        lambda s: all(s[n]["pid"] != first[n]["pid"] for n in ("prefill", "decode")) and proven(s),
        READY_S,
        "both relaunched",
    )
    for name in ("prefill", "decode"):
        assert after[name]["restarts"] == first[name]["restarts"] + 1, after[name]
    ready(pd, "after")
    added = [e for e in pd.events("gateway.added") if ts(e) > killed_at]
    assert {e["server"] for e in added} == {"prefill", "decode"}
    for event in added:
        proofs = [ts(e) for e in proved(pd, event["server"]) if ts(e) > killed_at]
        assert proofs and ts(event) >= proofs[0], (event, proofs)
    assert not pd.events("pd.restart_decode")


def proved(dep: RealPdDeployment, name: str) -> list[dict[str, Any]]:
    """When `name` was proven, oldest first: it became serving with its canary passed, or serving unproven passed
    it later."""
    became = [
        e
        for e in dep.events("state.transition")
        if e["server"] == name and e["new"] == "serving" and e["reason"] == "health 200 and canary passed"
    ]
    later = [e for e in dep.events("server.proven") if e["server"] == name]
    return sorted(became + later, key=ts)


def test_a_planned_prefill_restart_keeps_the_decode(pd: RealPdDeployment) -> None:
    """`restart --server prefill`: the prefill leaves SMG, is replaced and proven through the pair; the decode
    (which drops the old prefill after two missed heartbeats and finds the new one) keeps its PID, and a chat
    through SMG is answered by the new pair."""
    first = ready(pd, "before")
    status, body = pd.post("/control/restart", {"server": "prefill", "reason": "test"}, token=pd.token)
    assert status == 200, body
    after = pd.wait_all(
        lambda s: s["prefill"]["pid"] != first["prefill"]["pid"] and proven(s), READY_S, "prefill replaced"
    )
    assert after["decode"]["pid"] == first["decode"]["pid"]
    assert after["decode"]["restarts"] == first["decode"]["restarts"]
    assert not pd.events("pd.restart_decode")
    ready(pd, "after")


def test_a_prompt_too_large_for_the_decodes_pool_is_aborted_and_nothing_restarted(
    pd: RealPdDeployment,
) -> None:
    """real-pd.md §4b under load through SMG: the long prompt (sent to the pair directly: SMG would resend it after
    each abort, five tries by default) never pre-allocates on the decode and blocks every later request with /health
    200 on both. The decode's requests are aborted (incident `abort`), neither server is restarted or steps a rung,
    the prefill is not blamed, and the pair serves again."""
    first = ready(pd, "before")
    incidents = len(pd.incidents())
    assert pd.gateway is not None
    body = {
        "model": str(pd.model_dir),
        "messages": [{"role": "user", "content": LONG_PROMPT}],
        "max_tokens": 8,
    }
    with ThreadPoolExecutor(1) as pool, Chats(pd.gateway.url, str(pd.model_dir)) as chats:
        wait_for(lambda: chats.ok() >= 2, 120, "requests through the pair")
        sent_at = time.time()
        blocked = pool.submit(pair_chat, pd, body, 300)
        wait_for(
            lambda: any(i["action"] == "abort" for i in pd.incidents()[incidents:]), 180, "the decode's abort"
        )
        assert blocked.result(timeout=60) != 200
    new = pd.incidents()[incidents:]
    aborted = next(i for i in new if i["action"] == "abort")
    assert aborted["server"] == "decode" and aborted["fault"] == "pd_transfer_wedge", aborted
    assert aborted["evidence"]["tags"] == ["prealloc_blocked"], aborted
    assert not [i for i in new if i["action"] in ("relaunch", "fail", "failed")], new
    after = ready(pd, "after")
    for name in ("prefill", "decode"):
        assert after[name]["pid"] == first[name]["pid"] and after[name]["restarts"] == first[name]["restarts"]
        assert after[name]["fallback"]["rung"] == first[name]["fallback"]["rung"]
    print(f"abort {aborted['detected_at'] - sent_at:.1f}s after the long prompt was sent")
