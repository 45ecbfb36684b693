"""The daemon against one real SGLang server (tp 1, the scripted model) behind the real SMG 1.13.0, shared by the
tests of this module.

Configured without `--tool-call-parser` on purpose: the first test watches the family's parser set before the
first launch (no wasted load). The supervisor drives SMG (`[gateway]`): the server joins once proven, and a wedge
under SGLang's own benchmark client through SMG takes it out before its kill. The tests then run in file order on the same deployment, each starting from `serving` and leaving it
serving again (each fault costs one real relaunch); the last one stops the daemon.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.gateway.support import Dispatches, ts
from tests.real_serving.load import ServingLoad
from tests.real_serving.support import (
    READY_S,
    RealDeployment,
    generate,
    pids_alive,
    port_free,
    real_deployment,
    serving,
    serving_again,
    wait_running,
)
from tests.support.daemon import q
from tests.support.gateways import ADMIN_KEY, running_gateway
from tests.support.wait import wait_for


@pytest.fixture(scope="module")
def dep(
    tmp_path_factory: pytest.TempPathFactory, serving_python: Path, models: Path
) -> Iterator[RealDeployment]:
    """The real tp-1 deployment, its daemon started, launched with no tool-call parser."""
    root = tmp_path_factory.mktemp("real-tp1")
    (root / "gateway-key").write_text(ADMIN_KEY + "\n")
    with running_gateway("smg", root) as gw:
        lines = ["[gateway]", f"url = {q(gw.url)}", f"admin_key_file = {q(str(root / 'gateway-key'))}"]
        kw = {"python": serving_python, "models": models, "parsers": (None, None), "gateway_lines": lines}
        with real_deployment(root, tp=1, **kw) as d:
            d.gateway = gw
            d.start()
            yield d


def test_missing_parser_is_fixed_before_the_first_launch(dep: RealDeployment) -> None:
    """No --tool-call-parser configured: the one launch has `qwen` (a warning entry), the real canary passes."""
    fixed = dep.wait(serving, timeout=READY_S, what="serving with the family's parser")
    incident = fixed["last_incident"]
    assert incident["fault"] == "parser_misconfig" and incident["action"] == "fixed before launch"
    assert fixed["restarts"] == 0 and [i["action"] for i in dep.incidents()] == ["fixed before launch"]
    assert fixed["argv"][fixed["argv"].index("--tool-call-parser") + 1] == "qwen"
    canary = fixed["probes"]["probes"]["canary_tool"]
    assert canary["ok"] and canary["values"]["verdict"] == "pass", canary
    assert dep.ranks(fixed["pid"]).keys() >= {"sglang::scheduler", "sglang::detokenizer"}


def test_long_prompt_is_no_incident(dep: RealDeployment) -> None:
    """A ~3500-token prompt (a legitimately slow forward on CPU) completes and the daemon opens no incident."""
    before = dep.wait(serving, timeout=READY_S, what="serving")
    incidents = len(dep.incidents())
    ids = [(i * 7) % 500 + 10 for i in range(3500)]
    body = generate(dep.sim_url, {"input_ids": ids, "sampling_params": {"max_new_tokens": 16}}, timeout_s=600)
    assert body["meta_info"]["prompt_tokens"] == len(ids)
    after = dep.server()
    assert after["state"] == "serving" and after["pid"] == before["pid"]
    assert len(dep.incidents()) == incidents


def test_a_wedge_under_sglangs_benchmark_client_through_smg_leaves_it_before_the_kill(
    dep: RealDeployment, serving_python: Path
) -> None:
    """The real server proven and in SMG; SGLang's benchmark client through SMG; every rank stopped mid-load: the
    server leaves SMG before its kill, SMG sends it nothing until the relaunch is proven, then it rejoins."""
    gw = dep.gateway
    assert gw is not None
    first = dep.wait(serving, timeout=READY_S, what="serving")
    wait_for(lambda: dep.sim_url in gw.live(), 60, "the real server in SMG")
    dispatches = Dispatches(gw)
    load = ServingLoad(serving_python, gw.url, dep.model_dir, dep.root / "gw-load.jsonl", requests=400)
    load.concurrency, load.rate = 4, 4.0
    load.start()
    try:
        wait_running(dep.sim_url, 1, timeout=300)
        for proc in dep.ranks(first["pid"]).values():
            proc.suspend()
        again = serving_again(dep, first["pid"], "relaunched after the wedge")
        wait_for(lambda: dep.sim_url in gw.live(), 60, "the relaunch back in SMG")
    finally:
        load.stop()
        dispatches.close()
    incident = again["last_incident"]
    assert incident["fault"] in ("decode_wedge", "collective_hang", "health_unresponsive"), incident
    removed = [e for e in events(dep, "gateway.removed")]
    released = [e for e in events(dep, "recovery.release") if ts(e) > incident["detected_at"]]
    assert removed and released and ts(removed[-1]) < ts(released[0]), "out of SMG before the kill"
    assert dispatches.between(dep.sim_url, ts(removed[-1]) + 0.3, again["since"]) == []


def events(dep: RealDeployment, name: str) -> list[dict[str, object]]:
    """The daemon's log events called `name`."""
    out = []
    for line in (dep.root / "daemon.log").read_text(errors="replace").splitlines():
        with contextlib.suppress(ValueError):
            event = json.loads(line)
            if event.get("event") == name:
                out.append(event)
    return out


def test_scheduler_killed_is_a_crash_caught_before_sglang_tears_down(dep: RealDeployment) -> None:
    """SIGKILL of the real scheduler: a crash with rank_lost while SGLang's own 5 s teardown is still running."""
    first = dep.wait(serving, timeout=READY_S, what="serving")
    ranks = dep.ranks(first["pid"])
    old = {first["pid"], *(p.pid for p in ranks.values())}
    ranks["sglang::scheduler"].kill()
    again = serving_again(dep, first["pid"], "relaunched after the rank loss")
    incident = again["last_incident"]
    assert incident["fault"] == "crash"
    assert "rank_lost" in json.dumps(incident["evidence"])
    assert not pids_alive(old), "the whole old tree is gone"


def test_main_killed_reaps_every_rank_and_frees_the_port(dep: RealDeployment) -> None:
    """SIGKILL of the real main process: the orphaned ranks are reaped, the port freed, the server relaunched."""
    first = dep.wait(serving, timeout=READY_S, what="serving")
    ranks = {p.pid for p in dep.ranks(first["pid"]).values()}
    assert ranks, "the real tree has ranks"
    known = {i["id"] for i in dep.incidents()}
    os.kill(first["pid"], signal.SIGKILL)
    dep.wait(lambda s: s["pid"] != first["pid"], timeout=READY_S, what="a relaunch begins")
    assert not pids_alive(ranks), "ranks orphaned by the dead main were reaped before the relaunch"
    serving_again(dep, first["pid"], "relaunched after the main process died")
    opened = sorted((i for i in dep.incidents() if i["id"] not in known), key=lambda i: i["detected_at"])
    assert opened and opened[0]["fault"] == "crash", opened


def test_sigterm_to_the_daemon_leaves_nothing_running_or_bound(dep: RealDeployment) -> None:
    """SIGTERM of the daemon: the real tree is drained and gone, the daemon exits 0, the port is free."""
    first = dep.wait(serving, timeout=READY_S, what="serving")
    tree = {first["pid"], *(p.pid for p in psutil.Process(first["pid"]).children(recursive=True))}
    assert dep.daemon is not None
    os.kill(dep.daemon.pid, signal.SIGTERM)
    assert dep.daemon.wait(timeout=120) == 0
    wait_for(lambda: not dep.ours(), 30, "every process of the real server gone")
    assert not pids_alive(tree)
    assert port_free(dep.port)
