"""A server that floods its log: bounded memory, rotated files, the tick on time, the lines that matter caught.

The issue asks for a minute of tens of MB/s; the test floods for FLOOD_S (10 s) at whatever rate the child
reaches (the flooder's last line says how much it wrote; the test reports the rate as the `flood_mb_per_s`
property and benchmarks/README.md quotes a measured run); the bounds do not depend on the duration, only the disk
written does.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from probes.logwatch import LogWatch
from supervisor.config import SupervisorConfig
from supervisor.host.launcher import Launched, MiB, spawn

pytestmark = pytest.mark.hardening

FLOOD_S = 10.0
OUTPUT_END_S = (
    30.0  # the reader reaches the end of the file after the flooder's exit (a starved core: seconds)
)
ROTATE_BYTES, ROTATE_KEEP, RING = 8 * MiB, 2, 2000
FLOODER = r"""
import os, sys, time
batch = b"[2026-12-01 00:00:00 TP0] Decode batch. #running-req: 32, #token: 4096, token usage: 0.05, gen throughput (token/s): 1234.56, #queue-req: 0\n"
unique = b"[2026-12-01 00:00:00] INFO: 127.0.0.1 - POST /generate rid=%08x%08x 200 OK\n"
fatal = [
    b"[2026-12-01 00:00:01 TP3] Subprocess scheduler_3 (pid=4242) crashed with exit code -9\n",
    b"[2026-12-01 00:00:02 TP5] Decode out of memory. Try to lower your batch size.\n",
    b"Fatal Python error: Segmentation fault\n",
]
end = time.monotonic() + float(sys.argv[1])
block = batch * 2000
n = 0
while time.monotonic() < end:
    os.write(1, block)
    os.write(1, b"".join(unique % (n, i) for i in range(300)))
    if n % 50 == 25:
        os.write(1, fatal[(n // 50) % len(fatal)])
    n += 1
os.write(1, b"[2026-12-01 00:00:11 TP1] Scheduler hit an exception: Traceback (most recent call last):\n")
os.write(1, b"RuntimeError: CUDA error: an illegal memory access was encountered\n")
os.write(1, b"flood total: %d bytes in %.2f s\n" % (n * (len(block) + 300 * len(unique % (0, 0))), float(sys.argv[1])))
"""


async def _supervise(launched: Launched) -> tuple[set[str], float, int]:
    """What the monitor does once a second (read new lines, classify), with a 0.1 s ticker measuring lateness."""
    watch, cursor, hits, late = LogWatch(), 0, set(), 0.0
    peak_rss = 0
    me = psutil.Process()

    async def ticker() -> None:
        nonlocal late
        while True:
            before = time.monotonic()
            await asyncio.sleep(0.1)
            late = max(late, time.monotonic() - before - 0.1)

    task = asyncio.create_task(ticker())
    try:
        while launched.returncode() is None:
            await asyncio.sleep(1.0)
            lines, cursor = launched.lines_since(cursor)
            obs = watch.observe(lines, time.monotonic())
            hits |= {h["name"] for h in obs.values["hits"]}
            peak_rss = max(peak_rss, me.memory_info().rss)
        # the watch too waits for the reader to reach the end (LOG_SETTLE_S) after a loss
        deadline = time.monotonic() + OUTPUT_END_S
        while not launched.output_ended() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
    finally:
        task.cancel()
    lines, cursor = launched.lines_since(cursor)
    hits |= {h["name"] for h in watch.observe(lines, time.monotonic()).values["hits"]}
    return hits, late, peak_rss


def test_a_log_flood_is_bounded_rotated_and_its_fatal_lines_still_matched(
    tmp_path: Path, record_property: Callable[[str, object], None]
) -> None:
    """The crash lines after a flood are matched, those buried in it unless skipped with the flood (counted);
    ring, RSS and disk stay bounded; the tick on time."""
    log = tmp_path / "flood.log"
    rss_before = psutil.Process().memory_info().rss
    launched = spawn(
        [sys.executable, "-c", FLOODER, str(FLOOD_S)],
        {},
        [],
        "run-flood",
        "flood",
        log,
        ring_lines=RING,
        rotate_bytes=ROTATE_BYTES,
        rotate_keep=ROTATE_KEEP,
    )
    assert isinstance(launched, Launched)
    try:
        hits, late, peak_rss = asyncio.run(_supervise(launched))
    finally:
        launched.close(10)
    total = [line for line in launched.tail(5) if line.startswith("flood total:")]
    assert total, "the flooder ran to its end"
    written, seconds = int(total[-1].split()[2]), float(total[-1].split()[5])
    record_property("flood_mb_per_s", round(written / seconds / 1e6, 1))
    record_property("unscanned_lines", launched.unscanned_lines)
    assert {"sched_exception", "ima"} <= hits, "the server's last words after its flood are matched"
    # A flood faster than the reader is jumped over, its lines counted as unscanned and left in the file
    # (supervisor/host/runlog.py): a fatal line buried in it is matched unless it fell in such a jump.
    buried = {"subprocess_crash", "decode_oom", "py_fatal"}
    assert buried <= hits or launched.unscanned_lines > 0, (hits, launched.unscanned_lines)
    files = sorted(tmp_path.glob("flood.log*"))
    assert [f.name for f in files] == ["flood.log", "flood.log.1", "flood.log.2"], "rotated, keep=2"
    assert sum(f.stat().st_size for f in files) <= (ROTATE_KEEP + 1) * ROTATE_BYTES + MiB
    assert len(launched.tail(10 * RING)) == RING
    assert peak_rss - rss_before < 64 * MiB, f"RSS grew {(peak_rss - rss_before) / MiB:.0f} MiB"
    tick_limit = 3 * SupervisorConfig().tick_s  # stricter than /healthz (stale after max(10 s, 10 ticks))
    assert late < tick_limit, f"the loop was {late:.2f} s late"
