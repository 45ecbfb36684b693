"""The case that opened the real-serving work: a healthy real server whose model never answers the canary decisively.

The random model (`--load-format dummy`) never calls a tool and never stops before `max_tokens`, so every tool
canary is inconclusive (`finish_reason: length`). With the default `canary_mode = "require"` the server must not be
stranded in `starting`: after the inconclusive limit it is `serving` unproven, with a warning. A scheduler killed
afterwards is a `crash` of a server that was healthy, not a `startup_failure`.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

from tests.real_serving.support import READY_S, real_deployment, serving


def _unproven_metric(url: str, server: str) -> float:
    with urllib.request.urlopen(url + "/metrics", timeout=5) as resp:
        text = resp.read().decode()
    for line in text.splitlines():
        if line.startswith(f'sglang_supervisor_canary_unproven{{server="{server}"}}'):
            return float(line.split()[-1])
    raise AssertionError(f"no sglang_supervisor_canary_unproven series for server {server}")


def test_a_model_that_never_answers_the_canary_serves_unproven_and_a_later_rank_loss_is_a_crash(
    tmp_path: Path, serving_python: Path, models: Path
) -> None:
    """Random weights: inconclusive canaries → serving unproven (warning, metric 1); scheduler SIGKILL → crash."""
    with real_deployment(
        tmp_path,
        tp=1,
        python=serving_python,
        models=models,
        model_name="random-qwen2.5",
        parsers=("qwen", None),
    ) as dep:
        dep.start()
        s = dep.wait(serving, timeout=READY_S, what="serving, proven or not")
        assert s["unproven"].startswith("serving unproven"), s["unproven"]
        canary = s["probes"]["probes"]["canary_tool"]
        assert canary["values"]["verdict"] == "inconclusive", canary
        assert _unproven_metric(dep.url, dep.name) == 1.0
        warned = [i for i in dep.incidents() if i["fault"] == "canary_unproven"]
        assert warned and warned[0]["severity"] == "warning", warned

        dep.ranks(s["pid"])["sglang::scheduler"].kill()

        def crash_recorded(status: dict[str, Any]) -> bool:
            incident = status.get("last_incident") or {}
            return incident.get("fault") not in (None, "canary_unproven")

        after = dep.wait(crash_recorded, timeout=READY_S, what="an incident for the rank loss")
        incident = after["last_incident"]
        assert incident["fault"] == "crash", incident
        assert "rank_lost" in json.dumps(incident["evidence"])
