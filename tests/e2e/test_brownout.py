"""A brownout (a queue that only grows, the running requests pinned, throughput far under the server's own
baseline): an incident and an alert, `degraded`, no restart by default — and `serving` again once it clears."""

from __future__ import annotations

import json
import threading
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.support.daemon import Deployment, deployment
from tests.support.wait import wait_for

pytestmark = pytest.mark.e2e


def incidents(dep: Deployment) -> list[dict[str, Any]]:
    journal = dep.root / "state" / "incidents.jsonl"
    lines = journal.read_text().splitlines() if journal.exists() else []
    return [e for e in map(json.loads, lines) if e["fault"] != "operator"]


class Clients:
    """`n` threads of sequential short `/generate` requests (3 s client timeout) until stopped."""

    def __init__(self, url: str, n: int) -> None:
        self.url, self.stop, self.sent = url, threading.Event(), 0
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(n)]
        for thread in self.threads:
            thread.start()

    def _run(self) -> None:
        body = json.dumps({"text": "hello", "sampling_params": {"max_new_tokens": 16}}).encode()
        while not self.stop.is_set() and self.sent < 5000:
            self.sent += 1
            req = urllib.request.Request(self.url + "/generate", body, {"Content-Type": "application/json"})
            try:
                urllib.request.urlopen(req, timeout=3).read()
            except OSError:
                self.stop.wait(0.2)

    def close(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(10)


def test_a_brownout_is_an_alert_and_clears_without_a_restart(tmp_path: Path) -> None:
    """Four clients; after 400 requests (tens of seconds of normal service, several scrapes: the server's own
    baseline) every step is 20 times slower and the batch pinned at its size: the queue grows for
    `brownout_after_s` (20 s here) at a few percent of the baseline throughput → `brownout`, action `alert`,
    `degraded`, same PID. The clients stop, the queue shrinks: `serving` again, the incident resolved."""
    scenario = tmp_path / "scenario.toml"
    scenario.write_text('[[fault]]\nname = "brownout"\nafter_requests = 400\n')
    env = {"SGLANG_SIM_SCENARIO": str(scenario)}
    with deployment(tmp_path, env=env, probes={"brownout_after_s": 20}) as dep:
        dep.start()
        first = dep.wait(lambda s: s["state"] == "serving", timeout=120, what="serving")
        clients = Clients(dep.sim_url, 4)
        try:
            down = dep.wait(lambda s: s["state"] == "degraded", timeout=180, what="the brownout alert")
        finally:
            clients.close()
        incident = wait_for(lambda: incidents(dep), 10, "the incident")[0]
        assert incident["fault"] == "brownout" and incident["action"] == "alert", incident
        load = incident["evidence"]["load"]
        assert load["tokens_per_s"] < 0.3 * load["baseline_tokens_per_s"] and load["queue_grew"] >= 2, load
        assert down["pid"] == first["pid"]
        again = dep.wait(lambda s: s["state"] == "serving", timeout=240, what="serving once it cleared")
        assert again["pid"] == first["pid"] and again["restarts"] == 0
        assert again["last_incident"]["recovered_at"] is not None
