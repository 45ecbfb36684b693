"""The requests in flight, from SGLang's own request log (`--log-requests --log-requests-format json`, level ≥ 1).

SGLang 0.5.23 lists no request ids anywhere else (`/v1/loads` counts them; no endpoint names them). With the JSON
request log each request is two lines of the server's log (docs/contracts.md, "Request log"): `request.received`
(its `rid` and, from level 1, its `sampling_params.max_new_tokens`) when the tokenizer takes it, and
`request.finished` when its answer is complete — an aborted one too — with `out.meta_info` (`e2e_latency`,
`completion_tokens`, `finish_reason`). The ledger keeps the requests received and not finished, with when they
came (bounded: `MAX_IN_FLIGHT`), and the latency of the last `MAX_FINISHED` finished ones; SGLang's own health
generation (`HEALTH_CHECK_…`) is left out. It reports; `policies.stuck` judges.
"""

from __future__ import annotations

import json
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any

from policies.model import Observation, RequestsValues

MAX_IN_FLIGHT = 20000  # the oldest are forgotten beyond this (a log that lost its finished lines)
MAX_FINISHED = 256
MAX_REPORTED = 5  # the oldest requests an observation names
MARK = '"event": "request.'


@dataclass
class Received:
    """One request in flight."""

    at: float  # monotonic, when its received line was read
    max_new_tokens: int | None
    finished_before: int  # how many requests had finished when it came


@dataclass
class RequestLedger:
    """What the request log has shown during this launch."""

    in_flight: OrderedDict[str, Received] = field(default_factory=OrderedDict)
    e2e_s: deque[float] = field(default_factory=lambda: deque(maxlen=MAX_FINISHED))
    per_token_s: deque[float] = field(default_factory=lambda: deque(maxlen=MAX_FINISHED))
    finished: int = 0
    seen: bool = False  # a request line was read: the server logs its requests
    aborted: dict[str, float] = field(
        default_factory=dict
    )  # rid -> when the supervisor aborted it (monotonic)
    aborts: int = 0  # requests the supervisor aborted in this launch

    def reset(self) -> None:
        """A new launch: no request known."""
        self.in_flight.clear()
        self.e2e_s.clear()
        self.per_token_s.clear()
        self.finished, self.seen, self.aborts = 0, False, 0
        self.aborted.clear()

    def note_aborted(self, rids: list[str], now: float) -> None:
        """The supervisor asked SGLang to abort these requests now."""
        for rid in rids:
            self.aborted.setdefault(rid, now)
        self.aborts += len(rids)

    def observe(self, lines: list[str], now: float) -> Observation | None:
        """Fold the new log lines in (probe `requests`); None while the server has logged no request."""
        for line in lines:
            if MARK in line:
                self._line(line, now)
        if not self.seen:
            return None
        oldest = list(self.in_flight.items())[:MAX_REPORTED]
        values: RequestsValues = {
            "in_flight": len(self.in_flight),
            "finished": self.finished,
            "p99_e2e_s": _p99(self.e2e_s),
            "p99_per_token_s": _p99(self.per_token_s),
            "oldest": [
                {
                    "rid": rid,
                    "age_s": round(now - r.at, 3),
                    "max_new_tokens": r.max_new_tokens,
                    "finished_since": self.finished - r.finished_before,
                    "aborted_s": round(now - self.aborted[rid], 3) if rid in self.aborted else None,
                }
                for rid, r in oldest
            ],
            "aborts": self.aborts,
        }
        age = f"; oldest {values['oldest'][0]['age_s']:.0f}s" if oldest else ""
        detail = f"{len(self.in_flight)} requests in flight, {self.finished} finished{age}"
        return Observation("requests", now, True, detail, 0.0, dict(values))

    def _line(self, line: str, now: float) -> None:
        try:
            data = json.loads(line[line.index("{") :])
            event, rid = str(data["event"]), str(data["rid"])
        except (ValueError, KeyError, TypeError, RecursionError):
            return
        if rid.startswith("HEALTH_CHECK_"):
            return
        self.seen = True
        if event == "request.received":
            self.in_flight[rid] = Received(now, _max_tokens(data), self.finished)
            while len(self.in_flight) > MAX_IN_FLIGHT:
                self.in_flight.popitem(last=False)
        elif event == "request.finished":
            self.in_flight.pop(rid, None)
            self.aborted.pop(rid, None)
            self.finished += 1
            meta = (data.get("out") or {}).get("meta_info") or {}
            e2e, tokens = meta.get("e2e_latency"), meta.get("completion_tokens")
            if isinstance(e2e, int | float) and e2e >= 0:
                self.e2e_s.append(float(e2e))
                if isinstance(tokens, int) and tokens > 0:
                    self.per_token_s.append(float(e2e) / tokens)


def _max_tokens(data: dict[str, Any]) -> int | None:
    sampling = (data.get("obj") or {}).get("sampling_params") or {}
    value = sampling.get("max_new_tokens") if isinstance(sampling, dict) else None
    return value if isinstance(value, int) and value > 0 else None


def _p99(values: deque[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))], 4)
