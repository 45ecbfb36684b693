"""Throughput of the log-signature classifier on a realistic log flood (lines/s); a figure, not a test.

Run: `.venv/bin/python -m benchmarks.bench_signatures [--lines N]`. The mix is mostly access-log and batch lines
(what a busy server writes), with a few progress, warning and fatal lines.
"""

from __future__ import annotations

import argparse
import time

from policies.signatures import classify

MIX = (
    '[2026-07-20 12:00:00] INFO:     127.0.0.1:51234 - "POST /v1/chat/completions HTTP/1.1" 200 OK',
    '[2026-07-20 12:00:00] INFO:     127.0.0.1:51234 - "GET /health HTTP/1.1" 200 OK',
    "[2026-07-20 12:00:00 TP0] Decode batch, #running-req: 31, #token: 9123, token usage: 0.41, cuda graph: True, "
    "gen throughput (token/s): 2210.55, #queue-req: 0",
    "[2026-07-20 12:00:00 TP0] Prefill batch, #new-seq: 2, #new-token: 4096, #cached-token: 120, token usage: 0.41, "
    "#running-req: 30, #queue-req: 1, cuda graph: False, input throughput (token/s): 18000.12",
    "[2026-07-20 12:00:00 TP0] KV cache pool is full. Retract requests. #retracted_reqs: 1, #new_token_ratio: 0.41",
    "[2026-07-20 12:00:00] Received output for rid='4f2a9c' but the state was deleted in TokenizerManager.",
    '  File "/sgl-workspace/sglang/python/sglang/srt/managers/scheduler.py", line 2911, in event_loop_overlap',
    "[2026-07-20 12:00:00 TP0] Scheduler hit an exception: Traceback (most recent call last):",
)
WEIGHTS = (40, 30, 12, 6, 4, 4, 3, 1)


def main() -> None:
    """Classify N lines of the mix and print lines/s."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--lines", type=int, default=500_000)
    args = parser.parse_args()
    pool = [line for line, w in zip(MIX, WEIGHTS, strict=True) for _ in range(w)]
    lines = [pool[i % len(pool)] for i in range(args.lines)]
    start = time.perf_counter()
    hits = sum(classify(line) is not None for line in lines)
    elapsed = time.perf_counter() - start
    print(f"{len(lines)} lines in {elapsed:.2f}s: {len(lines) / elapsed:,.0f} lines/s ({hits} catalogued)")


if __name__ == "__main__":
    main()
