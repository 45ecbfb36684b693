"""The DP section of the fidelity diff (`benchmarks/fidelity_diff.py --sections dp2`): the same observation sequence
against the real SGLang 0.5.23 at `--dp-size 2` on CPU and the simulator with the same flags.

Recorded per world: the tree's titles; `/v1/loads` (how many entries, their keys and `dp_rank`s); the metric names
that carry a `dp_rank` label; a `/generate` and a chat completion routed to DP rank 1 (`routed_dp_rank`) and which
rank's token counter moved; one routed to a rank that does not exist; then, with DP rank 1's scheduler SIGSTOPped and a request routed to it in flight: a
request routed to rank 0 (served or not), `/health` four times (status and seconds), whether each rank's `/v1/loads`
`timestamp` and token counter still move, and the running counts `/v1/loads` reports per rank.

Everything listens on 127.0.0.1; every process is killed at the end.
"""

from __future__ import annotations

import json
import re
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks.fidelity_target import Target, http_call, metric_shapes, scripted_targets

_SAMPLE = re.compile(r"^sglang:(\w+)\{(.*)\} ([0-9.e+-]+)$")
GENERATE = {"text": "hello", "sampling_params": {"max_new_tokens": 8}}
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}


def _body(target: Target) -> dict[str, Any]:
    _, _, text = http_call("GET", target.url + "/v1/loads", None, 10)
    try:
        body = json.loads(text)
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def _loads(target: Target) -> list[dict[str, Any]]:
    try:
        return list(_body(target)["loads"])
    except (KeyError, TypeError):
        return []


def _tokens_by_rank(target: Target) -> dict[str, float]:
    """Each `dp_rank` label's `realtime_tokens_total` (summed over modes)."""
    out: dict[str, float] = {}
    for line in http_call("GET", target.url + "/metrics", None, 30)[2].splitlines():
        found = _SAMPLE.match(line)
        if found and found.group(1) == "realtime_tokens_total":
            rank = re.search(r'dp_rank="(\d+)"', found.group(2))
            key = rank.group(1) if rank else "-"
            out[key] = out.get(key, 0.0) + float(found.group(3))
    return out


def _moved(before: dict[str, float], after: dict[str, float]) -> list[str]:
    return sorted(k for k in after if after[k] != before.get(k))


def observe(target: Target) -> dict[str, Any]:
    """The whole sequence on one server; leaves it killed."""
    try:
        target.wait_ready()
        profile: dict[str, Any] = {"titles": target.titles()}
        body = _body(target)
        loads = list(body.get("loads") or [])
        profile["loads"] = {
            "entries": len(loads),
            "top_keys": sorted(body),
            "dp_rank_count": body.get("dp_rank_count"),
            "aggregate_keys": sorted(body.get("aggregate") or {}),
            "keys": sorted({k for entry in loads for k in entry}),
            "dp_ranks": [entry.get("dp_rank") for entry in loads],
        }
        shapes = metric_shapes(http_call("GET", target.url + "/metrics", None, 30)[2])
        profile["metrics_with_dp_rank"] = sorted(n for n, labels in shapes.items() if "dp_rank" in labels)
        before = _tokens_by_rank(target)
        routed = http_call("POST", target.url + "/generate", {**GENERATE, "routed_dp_rank": 1}, 120)[0]
        chat = http_call("POST", target.url + "/v1/chat/completions", {**CHAT, "routed_dp_rank": 1}, 120)[0]
        profile["routed_to_1"] = {
            "generate": routed,
            "chat": chat,
            "moved": _moved(before, _tokens_by_rank(target)),
        }
        code, _, said = http_call("POST", target.url + "/generate", {**GENERATE, "routed_dp_rank": 2}, 60)
        profile["routed_to_2"] = [code, said.strip()[:200]]
        profile["rank1_stopped"] = _stopped(target)
        return profile
    finally:
        target.kill()


def _stopped(target: Target) -> dict[str, Any]:
    """SIGSTOP DP rank 1's scheduler with a request routed to it in flight."""
    body = {
        "text": "hello",
        "sampling_params": {"max_new_tokens": 3000, "ignore_eos": True},
        "routed_dp_rank": 1,
    }
    threading.Thread(
        target=http_call, args=("POST", target.url + "/generate", body, 300), daemon=True
    ).start()
    time.sleep(2.0)
    title = next(t for t in target.titles() if "DP1" in t)
    target.rank(title).suspend()
    time.sleep(2.0)
    stamps, tokens = {e.get("dp_rank"): e.get("timestamp") for e in _loads(target)}, _tokens_by_rank(target)
    served = http_call("POST", target.url + "/generate", {**GENERATE, "routed_dp_rank": 0}, 60)[0]
    health = []
    for _ in range(4):
        code, took, _ = http_call("GET", target.url + "/health", None, 40)
        health.append([code, round(took / 5) * 5])
    loads = _loads(target)
    later = {e.get("dp_rank"): e.get("timestamp") for e in loads}
    return {
        "routed_to_0": served,
        "health": health,
        "loads_answers": bool(loads),
        "timestamp_moved": sorted(str(r) for r in later if later[r] != stamps.get(r)),
        "tokens_moved": _moved(tokens, _tokens_by_rank(target)),
        "running": {str(e.get("dp_rank")): e.get("num_running_reqs") for e in loads},
    }


def profiles(sim_only: bool, work: Path) -> dict[str, Any]:
    """The DP profile of each world (the simulator, then the real server unless `sim_only`), under `work`."""
    return {
        target.kind: observe(target)
        for target in scripted_targets(
            sim_only,
            work,
            "dp",
            ["--dp-size", "2", "--enable-metrics"],
            {"SGLANG_CPU_OMP_THREADS_BIND": "0|1"},
        )
    }
