"""SGLang's Prometheus metrics (names, types, labels, update cadence), rendered as text exposition.

Batch gauges change only when the scheduler logs stats (a prefill batch, every `--decode-log-interval` decode
steps, an idle tick every 30 s), so they freeze at their last values when the ranks wedge; decode counters tick on
every step; token totals move only when a request finishes.
"""

from __future__ import annotations

import bisect
import threading
from collections import defaultdict
from datetime import UTC, datetime
from typing import Any

TTFT_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 400.0)
ITL_BUCKETS = (0.002, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0)
E2E_BUCKETS = (0.3, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 2400.0)
# SGLang 0.5.23's KV transfer histograms (a PD prefill observes all five per transfer, a decode the first two)
KV_TRANSFER_BUCKETS = {
    "kv_transfer_bootstrap_ms": (1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500),
    "kv_transfer_alloc_ms": (1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500),
    "kv_transfer_latency_ms": (1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000),
    "kv_transfer_speed_gb_s": (0.1, 0.5, 1, 5, 10, 25, 50, 100, 200, 400),
    "kv_transfer_total_mb": (1, 5, 10, 50, 100, 500, 1000, 5000, 10000),
}
# Every stats log writes these, whatever the mode (SGLang's `log_stats`), next to the batch gauges
STATS_GAUGES = (
    "kv_available_tokens", "kv_used_tokens", "kv_evictable_tokens",
    "num_prefill_bootstrap_queue_reqs", "num_prefill_inflight_queue_reqs",
    "num_decode_prealloc_queue_reqs", "num_decode_transfer_queue_reqs", "num_decode_deferred_kv_release_reqs",
    "pending_prealloc_token_usage", "prealloc_full_token_usage", "prealloc_swa_token_usage",
)  # fmt: skip


class _Histogram:
    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)
        self.total = 0.0
        self.n = 0

    def observe(self, value: float, count: int = 1) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += count
        self.total += value * count
        self.n += count

    def render(self, name: str, labels: str) -> list[str]:
        lines, acc = [], 0
        for bound, c in zip((*self.buckets, float("inf")), self.counts, strict=True):
            acc += c
            le = "+Inf" if bound == float("inf") else repr(bound)
            lines.append(f'{name}_bucket{{{labels},le="{le}"}} {acc}')
        lines.append(f"{name}_sum{{{labels}}} {self.total}")
        lines.append(f"{name}_count{{{labels}}} {self.n}")
        return lines


class TokenizerStats:
    """The tokenizer's metrics, one set per server whatever its DP size: request totals, latency histograms, HTTP."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counters: dict[str, float] = defaultdict(float)
        self.ttft_h = _Histogram(TTFT_BUCKETS)
        self.itl_h = _Histogram(ITL_BUCKETS)
        self.e2e_h = _Histogram(E2E_BUCKETS)
        self.http_active: dict[tuple[str, str], int] = defaultdict(int)
        self.http_total: dict[tuple[str, str], int] = defaultdict(int)
        self.http_responses: dict[tuple[str, str, str], int] = defaultdict(int)

    def ttft(self, seconds: float) -> None:
        """Time to first token of a request."""
        with self._lock:
            self.ttft_h.observe(seconds)

    def itl(self, seconds: float, tokens: int = 1) -> None:
        """Inter-token latency; the count is effectively 'tokens streamed'."""
        with self._lock:
            self.itl_h.observe(seconds, tokens)

    def finished(self, prompt_tokens: int, generated: int, e2e_s: float) -> None:
        """A request finished: the token totals move only now."""
        with self._lock:
            self.counters["prompt_tokens_total"] += prompt_tokens
            self.counters["generation_tokens_total"] += generated
            self.counters["num_requests_total"] += 1
            self.e2e_h.observe(e2e_s)

    def transfer_failed(self) -> None:
        """A PD KV transfer failed (decode side)."""
        with self._lock:
            self.counters["num_transfer_failed_reqs_total"] += 1

    def http_begin(self, endpoint: str, method: str) -> None:
        """The HTTP middleware saw a request start."""
        with self._lock:
            self.http_active[(endpoint, method)] += 1
            self.http_total[(endpoint, method)] += 1

    def http_end(self, endpoint: str, method: str, status: int) -> None:
        """The HTTP middleware saw a request end."""
        with self._lock:
            self.http_active[(endpoint, method)] -= 1
            self.http_responses[(endpoint, str(status), method)] += 1

    def families(self, base: str) -> list[tuple[str, str, list[str]]]:
        """(name, type, samples) of each family, labelled `base` (no rank labels: the tokenizer has none)."""
        out: list[tuple[str, str, list[str]]] = []
        with self._lock:
            for name, value in sorted(self.counters.items()):
                out.append((name, "counter", [f"sglang:{name}{{{base}}} {value}"]))
            for hname, hist in (
                ("time_to_first_token_seconds", self.ttft_h),
                ("inter_token_latency_seconds", self.itl_h),
                ("e2e_request_latency_seconds", self.e2e_h),
            ):
                out.append((hname, "histogram", hist.render(f"sglang:{hname}", base)))
            active = [
                f'sglang:http_requests_active{{endpoint="{ep}",method="{method}"}} {n}'
                for (ep, method), n in sorted(self.http_active.items())
            ]
            total = [
                f'sglang:http_requests_total{{endpoint="{ep}",method="{method}"}} {n}'
                for (ep, method), n in sorted(self.http_total.items())
            ]
            responses = [
                f'sglang:http_responses_total{{endpoint="{ep}",status_code="{status}",method="{method}"}} {n}'
                for (ep, status, method), n in sorted(self.http_responses.items())
            ]
        out += [
            ("http_requests_active", "gauge", active),
            ("http_requests_total", "counter", total),
            ("http_responses_total", "counter", responses),
        ]
        return out


class SimMetrics:
    """One DP rank's scheduler metrics (the whole server's when it is not data-parallel), thread-safe; the
    tokenizer's metrics it shares with the server's other ranks are `tokenizer`."""

    def __init__(
        self,
        model_name: str,
        engine_type: str,
        cuda_graph: bool,
        tokenizer: TokenizerStats | None = None,
        dp_rank: int | None = None,
    ) -> None:
        self._lock = threading.Lock()
        self.model_name = model_name
        self.engine_type = engine_type
        self.cuda_graph = cuda_graph
        self.tokenizer = tokenizer or TokenizerStats()
        self.dp_rank = dp_rank  # None: not data-parallel (no `dp_rank` label, `/v1/loads` names rank 0)
        self.gauges: dict[str, float] = {
            "num_running_reqs": 0,
            "num_queue_reqs": 0,
            "gen_throughput": 0.0,
            "token_usage": 0.0,
            "cache_hit_rate": 0.0,
            "num_used_tokens": 0,
        }
        self.gauges.update(dict.fromkeys(STATS_GAUGES, 0))
        self.gauges["kv_available_tokens"] = 4096
        # a decode writes its stats only with decode batches (every --decode-log-interval steps): none until then
        self.stats_logged = engine_type != "decode"
        self.kv_transfer = {name: _Histogram(b) for name, b in KV_TRANSFER_BUCKETS.items()}
        self.counters: dict[tuple[str, str], float] = defaultdict(float)  # the scheduler's, by name and mode
        self._decode_tokens_since_log = 0

    def rank(self, dp_rank: int) -> SimMetrics:
        """The scheduler metrics of another DP rank of this server (sharing its tokenizer metrics)."""
        return SimMetrics(self.model_name, self.engine_type, self.cuda_graph, self.tokenizer, dp_rank)

    @property
    def base(self) -> str:
        """The labels every metric of this server carries."""
        return f'model_name="{self.model_name}",engine_type="{self.engine_type}"'

    @property
    def token_usage(self) -> float:
        """The last reported KV token usage."""
        return float(self.gauges["token_usage"])

    def _set_batch_gauges(self, running: int, queue: int, parked: int) -> None:
        self.gauges["num_running_reqs"] = running
        self.gauges["num_queue_reqs"] = queue
        self.gauges["token_usage"] = round(min(0.95, 0.04 + running * 0.01), 2) if running or parked else 0.0
        self.gauges["num_used_tokens"] = running * 512
        self.gauges["kv_used_tokens"] = running * 512
        self.gauges["kv_available_tokens"] = max(0, 4096 - running * 512)
        if self.engine_type == "decode":
            self.gauges["num_decode_transfer_queue_reqs"] = parked
        if self.engine_type == "prefill":
            self.gauges["num_prefill_inflight_queue_reqs"] = parked

    def prefill(self, new: int, tokens: int, running: int, parked: int, queue: int = 0) -> None:
        """A prefill batch ran: stats are logged, gauges refresh (`queue`: the requests still waiting)."""
        with self._lock:
            self.counters[("realtime_tokens_total", 'mode="prefill_compute"')] += tokens
            mode = "prefill_cuda_graph" if self.cuda_graph else "prefill_none"
            self.counters[("cuda_graph_passes_total", f'mode="{mode}"')] += 1
            self._set_batch_gauges(running, queue, parked)
            self.stats_logged |= self.engine_type != "decode"  # a decode's "prefill" is its KV arriving
            del new

    def decode_step(self, tokens: int) -> None:
        """One decode iteration produced `tokens` tokens."""
        with self._lock:
            self.counters[("realtime_tokens_total", 'mode="decode"')] += tokens
            mode = "decode_cuda_graph" if self.cuda_graph else "decode_none"
            self.counters[("cuda_graph_passes_total", f'mode="{mode}"')] += 1
            self._decode_tokens_since_log += tokens

    def log_stats(self, running: int, queue: int, parked: int, throughput: float | None = None) -> None:
        """Every `--decode-log-interval` decode steps (and once when a pause retracts or aborts the batch)."""
        with self._lock:
            self._set_batch_gauges(running, queue, parked)
            rate = round(50.0 * max(running, 1), 2) if throughput is None else throughput
            self.gauges["gen_throughput"] = rate
            self.stats_logged = True

    def idle_tick(self) -> None:
        """The idle stats every 30 s: throughput 0, the PD queue gauges as they were (real-pd.md §4a: a decode
        with a request parked for KV and nothing running writes no batch stats, so they stay stale)."""
        with self._lock:
            parked = int(self.gauges.get("num_decode_transfer_queue_reqs", 0) or 0)
            parked = parked or int(self.gauges.get("num_prefill_inflight_queue_reqs", 0) or 0)
            self._set_batch_gauges(0, 0, parked)
            self.gauges["gen_throughput"] = 0.0

    def kv_transferred(self, bootstrap_ms: float, prompt_tokens: int | None = None) -> None:
        """A request's KV bootstrap (both sides) and, on the prefill (`prompt_tokens` given), its transfer."""
        with self._lock:
            self.kv_transfer["kv_transfer_bootstrap_ms"].observe(bootstrap_ms)
            self.kv_transfer["kv_transfer_alloc_ms"].observe(1.0)
            if prompt_tokens is not None:
                total_mb = prompt_tokens * 0.07  # a DeepSeek-sized layer stack: ~70 KB of KV per token
                self.kv_transfer["kv_transfer_total_mb"].observe(total_mb)
                self.kv_transfer["kv_transfer_latency_ms"].observe(5.0)
                self.kv_transfer["kv_transfer_speed_gb_s"].observe(total_mb / 5.0)

    def load_entry(
        self,
        snapshot_at: float,
        max_total_tokens: int,
        mode: str = "null",
        parked: int = 0,
        queues: tuple[int, int] = (0, 0),
        running: int | None = None,
    ) -> dict[str, Any]:
        """This rank's entry of `/v1/loads`: its load snapshot as of `snapshot_at`. Its `disaggregation` queues are
        live (the scheduler publishes them every loop), unlike the gauges; `parked` holds a decode's
        pre-allocation queue (`queues`: pre-allocation, a prefill's bootstrap queue) too; `running` is the batch
        as the scheduler last published it (the gauge's when not given)."""
        prealloc, bootstrap = queues
        with self._lock:
            g = dict(self.gauges)
        running, waiting = (
            int(g["num_running_reqs"] if running is None else running),
            int(g["num_queue_reqs"]),
        )
        waiting += parked if mode == "decode" else 0  # SGLang counts the transfer queue as waiting
        return {
            "timestamp": snapshot_at,
            "dp_rank": self.dp_rank or 0,
            "num_running_reqs": running,
            "num_waiting_reqs": waiting,
            "num_waiting_uncached_tokens": 0,
            "num_used_tokens": int(g["num_used_tokens"]),
            "num_total_tokens": max_total_tokens,
            "num_active_tokens": max_total_tokens,
            "num_prealloc_ready_tokens": 0,
            "max_total_num_tokens": max_total_tokens,
            "max_running_requests": 512,
            "token_usage": g["token_usage"],
            "gen_throughput": g["gen_throughput"],
            "cache_hit_rate": g["cache_hit_rate"],
            "utilization": g["token_usage"],
            "total_prefill_uncached_tokens": int(
                self.counters[("realtime_tokens_total", 'mode="prefill_compute"')]
            ),
            "total_prefill_busy_us": 0,
            "decode_moments": None,
            "memory": {
                "weight_gb": 62.3,
                "kv_cache_gb": 58.2,
                "graph_gb": 0.4,
                "token_capacity": max_total_tokens,
            },
            "queues": {"waiting": waiting, "grammar": 0, "paused": 0, "retracted": 0, "prealloc_ready": 0},
            "disaggregation": {
                "mode": mode,
                "prefill_bootstrap_queue_reqs": bootstrap if mode == "prefill" else 0,
                "prefill_inflight_queue_reqs": parked if mode == "prefill" else 0,
                "decode_prealloc_queue_reqs": prealloc if mode == "decode" else 0,
                "decode_transfer_queue_reqs": parked - prealloc if mode == "decode" else 0,
                "decode_retracted_queue_reqs": 0,
                "kv_transfer_speed_gb_s": 0.0,
                "kv_transfer_latency_ms": 0.0,
            },
        }

    def families(self) -> list[tuple[str, str, list[str]]]:
        """(name, type, samples) of this rank's scheduler metrics, labelled with its ranks."""
        sched = self.base + ',tp_rank="0",pp_rank="0",moe_ep_rank="0"'
        sched += f',dp_rank="{self.dp_rank}"' if self.dp_rank is not None else ""
        out: list[tuple[str, str, list[str]]] = []
        with self._lock:
            constants = [("kv_cache_memory_usage_gb", 0.1)]
            for name, value in [*constants, *(self.gauges.items() if self.stats_logged else ())]:
                out.append((name, "gauge", [f"sglang:{name}{{{sched}}} {value}"]))
            by_name: dict[str, list[str]] = defaultdict(list)
            for (name, extra), value in self.counters.items():
                by_name[name].append(f"sglang:{name}{{{sched}{',' + extra if extra else ''}}} {value}")
            out += [(name, "counter", lines) for name, lines in sorted(by_name.items())]
            for hname, hist in self.kv_transfer.items():
                if hist.n:
                    out.append((hname, "histogram", hist.render(f"sglang:{hname}", sched)))
        return out


def render(ranks: list[SimMetrics]) -> str:
    """The `/metrics` body of a server whose DP ranks are `ranks`: each family once, its samples from every rank."""
    families: dict[str, tuple[str, list[str]]] = {}
    for name, kind, samples in [
        *(f for r in ranks for f in r.families()),
        *ranks[0].tokenizer.families(ranks[0].base),
    ]:
        families.setdefault(name, (kind, []))[1].extend(samples)
    out: list[str] = []
    for name, (kind, samples) in families.items():
        out += [f"# HELP sglang:{name} {name}", f"# TYPE sglang:{name} {kind}", *samples]
    return "\n".join(out) + "\n"


def loads_body(entries: list[dict[str, Any]], accelerators: int) -> dict[str, Any]:
    """The `/v1/loads` body: each DP rank's entry, and the accelerators behind one DP rank."""
    return {
        "timestamp": datetime.now(UTC).isoformat(),
        "version": "0.5.23",
        "accelerator": "NVIDIA H200",
        "num_accelerators": accelerators,
        "loads": entries,
    }
