"""An idle engine whose ranks are frozen is acted on at its first failed /health, with the default probe settings;
a busy server on a saturated CPU with 8 streams in flight is never mistaken for one."""

from __future__ import annotations

import json
import os
import signal
import threading
import urllib.request
from pathlib import Path

import psutil
import pytest

from tests.e2e.test_cpu_starvation import BURN_S, saturated_cpu
from tests.support.daemon import deployment

pytestmark = pytest.mark.e2e


def serving(s: dict[str, object]) -> bool:
    return s["state"] == "serving"


def ranks_of(main: int) -> list[psutil.Process]:
    """The SGLang-titled processes under the main one (schedulers and detokenizer)."""
    out = []
    for child in psutil.Process(main).children(recursive=True):
        if " ".join(child.cmdline()).startswith("sglang::"):
            out.append(child)
    return out


def test_every_rank_of_an_idle_server_stopped_is_health_unresponsive_on_frozen_ranks(tmp_path: Path) -> None:
    """Idle, every rank SIGSTOPped (a GPU hang's shape): health_unresponsive with the ranks' `T` as evidence,
    decided at the first failed /health (one probe, not the 120 s streak), then relaunched and serving."""
    with deployment(tmp_path) as dep:
        dep.start()
        first = dep.wait(serving, timeout=120, what="serving")
        for proc in ranks_of(first["pid"]):
            os.kill(proc.pid, signal.SIGSTOP)
        again = dep.wait(lambda s: serving(s) and s["pid"] != first["pid"], timeout=180, what="relaunched")
        incident = again["last_incident"]
        assert incident["fault"] == "health_unresponsive", incident
        evidence = incident["evidence"]
        assert "ranks_frozen" in evidence["tags"] and len(evidence["health"]["statuses"]) == 1, evidence
        assert set(evidence["ranks"]["frozen"]) >= {"sglang::scheduler_TP0", "sglang::scheduler_TP1"}
        assert set(evidence["ranks"]["states"].values()) == {"T"}


def _stream(url: str, model: str, done: list[bool]) -> None:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "Tell a long story."}],
        "max_tokens": 2000,
        "stream": True,
    }
    req = urllib.request.Request(
        url + "/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=300) as resp:
        done.append(resp.status == 200 and b"[DONE]" in resp.read())


def test_eight_streams_on_a_saturated_cpu_are_no_incident(tmp_path: Path) -> None:
    """8 concurrent long streams while every core is busy for 25 s: each completes, no incident, no restart."""
    env = {"SGLANG_SIM_STEP_S": "0.015"}  # 2000 tokens ≈ 30 s per stream: longer than the CPU burn
    with deployment(tmp_path, env=env) as dep:
        dep.start()
        first = dep.wait(serving, timeout=120, what="serving")
        done: list[bool] = []
        threads = [threading.Thread(target=_stream, args=(dep.sim_url, dep.model, done)) for _ in range(8)]
        with saturated_cpu(BURN_S):
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(timeout=300)
        assert done == [True] * 8
        after = dep.server()
        assert after["last_incident"] is None and after["restarts"] == 0 and after["pid"] == first["pid"]
