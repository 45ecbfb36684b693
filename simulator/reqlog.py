"""SGLang's request log (`--log-requests`, `--log-requests-level`, `--log-requests-format`), as 0.5.23 writes it.

With the JSON format each request is two lines of the server's log: `request.received` when the tokenizer takes
it and `request.finished` when its answer is complete (an aborted one too, its finish reason `abort`), each
`{"timestamp", "event", "rid", "obj": {…}}`, the finished one with `"out": {"meta_info": {…}}`. Level 0 leaves out
the sampling parameters, levels 2 and 3 would add the text (the simulator writes none). SGLang's own health
generation is logged too (`HEALTH_CHECK_…`). As seen on the real server (docs/contracts.md, "Request log").
"""

from __future__ import annotations

import json
import time
from datetime import datetime
from typing import Any

from simulator.cli import SimServerArgs
from simulator.logs import log


class RequestLog:
    """Writes the request lines of one server (nothing without `--log-requests`)."""

    def __init__(self, args: SimServerArgs) -> None:
        self.on = bool(args.log_requests)
        self.level = int(args.log_requests_level)
        self.json = args.log_requests_format == "json"

    def _obj(self, rid: str, sampling: dict[str, Any], stream: bool) -> dict[str, Any]:
        obj: dict[str, Any] = {"rid": rid, "stream": stream}
        if self.level >= 1:
            obj["sampling_params"] = sampling
        return obj

    def received(self, rid: str, sampling: dict[str, Any], stream: bool) -> float:
        """The request is taken; returns when (for its latency)."""
        if self.on:
            obj = self._obj(rid, sampling, stream)
            if self.json:
                self._json("request.received", rid, obj)
            else:
                log(f"Receive: obj=GenerateReqInput({', '.join(f'{k}={v!r}' for k, v in obj.items())})")
        return time.monotonic()

    def finished(
        self, rid: str, sampling: dict[str, Any], stream: bool, reason: str, tokens: int, started: float
    ) -> None:
        """Its answer is complete (`reason`: SGLang's finish reason type)."""
        if not self.on:
            return
        finish: dict[str, Any] = {"type": reason}
        if reason == "abort":
            finish |= {"message": "Aborted", "status_code": None, "err_type": None}
        meta = {"id": rid, "finish_reason": finish, "completion_tokens": tokens}
        meta["e2e_latency"] = time.monotonic() - started
        obj = self._obj(rid, sampling, stream)
        if self.json:
            self._json("request.finished", rid, obj, {"out": {"meta_info": meta}})
        else:
            inner = ", ".join(f"{k}={v!r}" for k, v in obj.items())
            log(f"Finish: obj=GenerateReqInput({inner}), out={{'meta_info': {meta!r}}}")

    @staticmethod
    def _json(event: str, rid: str, obj: dict[str, Any], extra: dict[str, Any] | None = None) -> None:
        data = {
            "timestamp": datetime.now().isoformat(),
            "event": event,
            "rid": rid,
            "obj": obj,
            **(extra or {}),
        }
        log(json.dumps(data, ensure_ascii=False))
