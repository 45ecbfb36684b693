"""One request stuck while the server serves the rest (SGLang's JSON request log on): that request is aborted by its
id, nothing restarted, no other request failed; an abort that does not end it restarts the server."""

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
LOG_REQUESTS = ["--log-requests", "--log-requests-level", "1", "--log-requests-format", "json"]
PROBES = {"stuck_request_min_s": 8}


def serving(s: dict[str, Any]) -> bool:
    return s["state"] == "serving"


def scenario(root: Path, **params: bool) -> dict[str, str]:
    path = root / "scenario.toml"
    text = '[[fault]]\nname = "request_stuck"\nafter_requests = 8\n[fault.params]\n'
    path.write_text(text + "".join(f"{k} = {str(v).lower()}\n" for k, v in params.items()))
    return {"SGLANG_SIM_SCENARIO": str(path)}


def incidents(dep: Deployment) -> list[dict[str, Any]]:
    journal = dep.root / "state" / "incidents.jsonl"
    lines = journal.read_text().splitlines() if journal.exists() else []
    return [e for e in map(json.loads, lines) if e["fault"] != "operator"]


class Clients:
    """Two client threads of sequential `/generate` requests (each waits up to 120 s), each request's finish reason
    (or the error it got) kept by its rid."""

    def __init__(self, url: str, per_thread: int) -> None:
        self.url = url
        self.ends: dict[str, str] = {}
        self.threads = [
            threading.Thread(target=self._run, args=(t, per_thread), daemon=True) for t in range(2)
        ]
        for thread in self.threads:
            thread.start()

    def _run(self, thread: int, n: int) -> None:
        for i in range(n):
            rid = f"client{thread}-{i}"
            body = {"text": "hello", "rid": rid, "sampling_params": {"max_new_tokens": 8}}
            req = urllib.request.Request(
                self.url + "/generate", json.dumps(body).encode(), {"Content-Type": "application/json"}
            )
            try:
                with urllib.request.urlopen(req, timeout=120) as resp:
                    self.ends[rid] = json.loads(resp.read())["meta_info"]["finish_reason"]["type"]
            except (OSError, ValueError) as exc:
                self.ends[rid] = f"error {exc!r}"

    def join(self, timeout: float) -> dict[str, str]:
        for thread in self.threads:
            thread.join(timeout)
        return self.ends


def test_a_stuck_request_is_aborted_by_its_id_and_nothing_else_is_touched(tmp_path: Path) -> None:
    """A request that never gets a token while the others are served: `request_stuck` naming its rid, aborted by
    that rid (its client gets SGLang's abort), same PID, no restart, every other request finished normally."""
    with deployment(tmp_path, env=scenario(tmp_path), probes=PROBES, extra_args=LOG_REQUESTS) as dep:
        dep.start()
        first = dep.wait(serving, timeout=120, what="serving")
        dep.wait(lambda s: "canary_tool" in s["probes"]["probes"], timeout=60, what="the first canary")
        clients = Clients(dep.sim_url, per_thread=60)
        found = wait_for(lambda: incidents(dep), 120, "the stuck request's incident")
        ends = clients.join(180)
        incident = found[0]
        assert incident["fault"] == "request_stuck" and incident["action"] == "abort", incident
        (rid,) = incident["evidence"]["rids"]
        assert ends[rid] == "abort", ends.get(rid)
        others = {r: end for r, end in ends.items() if r != rid}
        assert len(others) == 119 and set(others.values()) == {"length"}, others
        after = dep.server()
        assert after["pid"] == first["pid"] and after["restarts"] == 0 and after["state"] == "serving"
        # each incident an abort (a loaded machine may hold a normal request past the test's 8 s window too)
        assert {(e["fault"], e["action"]) for e in incidents(dep)} == {("request_stuck", "abort")}


def test_an_abort_that_does_not_end_the_request_restarts_the_server(tmp_path: Path) -> None:
    """The stuck request ignores its abort (SGLang takes it and nothing ends): 30 s later the fault is tagged
    `abort_ineffective` and the server is relaunched with the same flags."""
    env = scenario(tmp_path, unabortable=True)
    with deployment(tmp_path, env=env, probes=PROBES, extra_args=LOG_REQUESTS) as dep:
        dep.start()
        first = dep.wait(serving, timeout=120, what="serving")
        dep.wait(lambda s: "canary_tool" in s["probes"]["probes"], timeout=60, what="the first canary")
        Clients(dep.sim_url, per_thread=200)
        again = dep.wait(lambda s: serving(s) and s["pid"] != first["pid"], timeout=180, what="relaunched")
        faults = incidents(dep)
        assert [(e["fault"], e["action"]) for e in faults][:1] == [("request_stuck", "abort")], faults
        last = next(e for e in faults if e["action"] != "abort")
        assert last["fault"] == "request_stuck" and "abort_ineffective" in last["evidence"]["tags"], last
        assert again["fallback"]["rung"] == 0 and again["restarts"] == 1
