"""The daemon against one real SGLang server (tp 1, the scripted model), shared by the tests of this module.

Configured without `--tool-call-parser` on purpose: the first test watches the family's parser set before the
first launch (no wasted load). The tests then run in file order on the same deployment, each starting from `serving` and leaving it
serving again (each fault costs one real relaunch); the last one stops the daemon.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.real_serving.support import (
    READY_S,
    RealDeployment,
    generate,
    pids_alive,
    port_free,
    real_deployment,
    serving,
    serving_again,
)
from tests.support.wait import wait_for


@pytest.fixture(scope="module")
def dep(
    tmp_path_factory: pytest.TempPathFactory, serving_python: Path, models: Path
) -> Iterator[RealDeployment]:
    """The real tp-1 deployment, its daemon started, launched with no tool-call parser."""
    root = tmp_path_factory.mktemp("real-tp1")
    with real_deployment(root, tp=1, python=serving_python, models=models, parsers=(None, None)) as d:
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
