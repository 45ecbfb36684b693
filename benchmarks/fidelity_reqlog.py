"""The request-log section of the fidelity diff (`benchmarks/fidelity_diff.py --sections reqlog`): SGLang 0.5.23's
JSON request log (`--log-requests --log-requests-level 1 --log-requests-format json`) against the simulator's.

Recorded per world: for a `/generate` with its own `rid`, a chat completion, and a long `/generate` aborted by its
`rid` (then an abort of an unknown rid): the events logged for each request, the keys of those lines, of their
`obj` and of `out.meta_info`, whether `sampling_params.max_new_tokens` is there, the finish reason's type, and the
abort calls' status codes. Everything listens on 127.0.0.1; every process is killed at the end.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks.fidelity_target import Target, http_call, scripted_targets

LOG = ["--log-requests", "--log-requests-level", "1", "--log-requests-format", "json"]


def _lines(target: Target) -> list[dict[str, Any]]:
    out = []
    for line in target.log_lines():
        if '"event": "request.' in line:
            try:
                out.append(json.loads(line[line.index("{") :]))
            except ValueError:
                continue
    return out


def observe(target: Target) -> dict[str, Any]:
    """The sequence on one server; leaves it killed."""
    try:
        target.wait_ready()
        generate = {"text": "hi", "rid": "fid-1", "sampling_params": {"max_new_tokens": 4}}
        chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
        seen: dict[str, Any] = {"generate": http_call("POST", target.url + "/generate", generate, 120)[0]}
        seen["chat"] = http_call("POST", target.url + "/v1/chat/completions", chat, 120)[0]
        long = {
            "text": "hi",
            "rid": "fid-long",
            "sampling_params": {"max_new_tokens": 3000, "ignore_eos": True},
        }
        threading.Thread(
            target=http_call, args=("POST", target.url + "/generate", long, 120), daemon=True
        ).start()
        time.sleep(3.0)  # the long request decoding
        seen["abort"] = http_call("POST", target.url + "/abort_request", {"rid": "fid-long"}, 30)[0]
        seen["abort_unknown"] = http_call("POST", target.url + "/abort_request", {"rid": "nope"}, 30)[0]
        time.sleep(2.0)  # its finished line written
        lines = [d for d in _lines(target) if not str(d.get("rid", "")).startswith("HEALTH_CHECK_")]
        by_rid: dict[str, list[str]] = {}
        for d in lines:
            by_rid.setdefault(str(d.get("rid")), []).append(str(d.get("event")))
        finished = [d for d in lines if d.get("event") == "request.finished"]
        seen["events"] = {r: e for r, e in by_rid.items() if r.startswith("fid-")}
        seen["requests_logged"] = len(by_rid)
        seen["line_keys"] = sorted({k for d in lines for k in d})
        seen["obj_keys_include"] = sorted(
            {"rid", "stream", "sampling_params"} & {k for d in lines for k in d["obj"]}
        )
        seen["max_new_tokens"] = sorted(
            {
                str((d["obj"].get("sampling_params") or {}).get("max_new_tokens"))
                for d in lines
                if d["rid"] == "fid-1"
            }
        )
        meta = [(d.get("out") or {}).get("meta_info") or {} for d in finished]
        seen["meta_keys_include"] = sorted(
            {"id", "finish_reason", "e2e_latency", "completion_tokens"} & {k for m in meta for k in m}
        )
        seen["finish"] = {
            str(d["rid"]): ((d.get("out") or {}).get("meta_info") or {}).get("finish_reason", {}).get("type")
            for d in finished
            if str(d["rid"]).startswith("fid-")
        }
        return seen
    finally:
        target.kill()


def profiles(sim_only: bool, work: Path) -> dict[str, Any]:
    """The request-log profile of each world (the simulator, then the real server unless `sim_only`)."""
    return {target.kind: observe(target) for target in scripted_targets(sim_only, work, "reqlog", LOG)}
