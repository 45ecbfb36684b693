"""Where the status endpoint should run: on the supervision loop, or on a thread of its own (issue 23's design).

In one process, the way the daemon holds it: the real `StatusServer` (shipped limits) over a stand-in daemon with
a journal of 500 incidents and the real metrics registry, and a stand-in for supervision on the main event loop:
a 5 ms timer whose lateness is sampled (ms), and every 0.1 s a scan of /proc in a worker thread (`asyncio.to_thread`,
as the reaper and the tree poll do) whose duration is sampled. A flood of 300 clients runs in a separate process
(its own interpreter, so its GIL is not ours). Cases:

- `idle`: no flood;
- `same_loop`: the endpoint on the supervision loop (what ships);
- `own_thread`: the endpoint on its own event loop in a second thread, the GIL shared with supervision.

Run: ``.venv/bin/python -m benchmarks.bench_status_loop [--quick]``.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

from benchmarks.common import parser, say, summary, write_result
from supervisor.config import HttpConfig
from supervisor.loop.commands import RungChange
from supervisor.records.journal import IncidentJournal
from supervisor.reporting.metrics import SupervisorMetrics
from supervisor.reporting.readiness import Readiness
from supervisor.reporting.status_http import StatusServer
from tests.hardening.flood import SEEDED, write_journal
from tests.support.daemon import ROOT

TIMER_S = 0.005
SCAN_EVERY_S = 0.1
CLIENTS = 300
FLOOD = """
import json, sys
from tests.hardening.flood import Flood
stats = Flood(int(sys.argv[1]), clients=int(sys.argv[2]), max_s=float(sys.argv[3])).__enter__().wait()
print(json.dumps({"responses": stats.responses, "per_s": stats.per_s, "errors": stats.errors}))
"""


class Source:
    """A daemon as the status server reads it: a status document of one server, the journal, real metrics."""

    def __init__(self, journal: Path) -> None:
        self.journal = IncidentJournal(journal)
        self.metrics = SupervisorMetrics()
        self.probes = {f"probe_{i}": {"ok": True, "latency": 0.01 * i, "values": {"n": i}} for i in range(12)}

    def status_document(self) -> dict[str, Any]:
        server = {
            "name": "sim",
            "state": "serving",
            "pid": 4242,
            "argv": ["--tp-size", "8"],
            "probes": self.probes,
        }
        return {"state": "serving", "servers": [server], "incidents": self.incidents_page(0, 20)}

    def incidents_page(self, offset: int, limit: int) -> list[dict[str, Any]]:
        return [i.to_json() for i in self.journal.page(offset, limit)]

    def metrics_text(self) -> bytes:
        return self.metrics.render()

    def loop_health(self) -> tuple[bool, float]:
        return True, 0.1

    def token_file(self) -> Path | None:
        return None

    async def control(self, kind: str, server: str | None, reason: str, actor: str) -> dict[str, str]:
        raise KeyError(server or "")

    async def control_rung(self, server: str, change: RungChange, reason: str, actor: str) -> dict[str, Any]:
        raise KeyError(server)

    def readiness(self, server: str | None) -> list[Readiness]:
        return [Readiness("sim", True, "sim: serving")]


def _scan() -> int:
    return sum(1 for _ in psutil.process_iter(["name", "ppid"]))


async def supervise(window_s: float) -> dict[str, Any]:
    """The stand-in for supervision: timer lateness and worker-thread scan durations over `window_s`."""
    late: list[float] = []
    scans: list[float] = []

    async def timer() -> None:
        while True:
            before = time.monotonic()
            await asyncio.sleep(TIMER_S)
            late.append((time.monotonic() - before - TIMER_S) * 1000)

    async def scanner() -> None:
        while True:
            before = time.monotonic()
            await asyncio.to_thread(_scan)
            scans.append((time.monotonic() - before) * 1000)
            await asyncio.sleep(SCAN_EVERY_S)

    tasks = [asyncio.create_task(timer()), asyncio.create_task(scanner())]
    await asyncio.sleep(window_s)
    for task in tasks:
        task.cancel()
    return {"timer_late_ms": summary(late), "p99_timer_late_ms": _p99(late), "scan_ms": summary(scans)}


def _p99(values: list[float]) -> float | None:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))], 3) if ordered else None


def _flood(port: int, window_s: float) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-c", FLOOD, str(port), str(CLIENTS), str(window_s)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
    )


async def same_loop(source: Source, window_s: float, flood: bool) -> dict[str, Any]:
    """The endpoint on this loop; supervision measured beside it."""
    server = StatusServer(source, HttpConfig(port=0))
    await server.start()
    try:
        proc = _flood(server.port, window_s + 5) if flood else None
        await asyncio.sleep(3 if flood else 0)  # the flood warming up (connections, first renders)
        result = await supervise(window_s)
        if proc is not None:
            out, _ = await asyncio.to_thread(proc.communicate, None, window_s + 60)
            result["flood"] = json.loads(out)
        return result
    finally:
        await server.stop()


def own_thread(source: Source, window_s: float) -> dict[str, Any]:
    """The endpoint on an event loop of its own in a second thread; supervision on the main thread's loop."""
    started = threading.Event()
    stop = threading.Event()
    ports: list[int] = []

    async def serve() -> None:
        server = StatusServer(source, HttpConfig(port=0))
        await server.start()
        ports.append(server.port)
        started.set()
        while not stop.is_set():
            await asyncio.sleep(0.1)
        await server.stop()

    thread = threading.Thread(target=lambda: asyncio.run(serve()), daemon=True)
    thread.start()
    started.wait(30)
    proc = _flood(ports[0], window_s + 5)
    try:
        time.sleep(3)  # the flood warming up
        result = asyncio.run(supervise(window_s))
        out, _ = proc.communicate(timeout=window_s + 60)
        result["flood"] = json.loads(out)
        return result
    finally:
        proc.kill()
        stop.set()
        thread.join(timeout=30)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the three cases and print the figures."""
    args = parser(__doc__).parse_args(argv)
    window = 10.0 if args.quick else 30.0
    report: dict[str, Any] = {"quick": args.quick, "window_s": window, "load_before": os.getloadavg()}
    with tempfile.TemporaryDirectory(prefix="sglsup-bench-") as tmp:
        source = Source(Path(tmp) / "incidents.jsonl")
        write_journal(source.journal.path, SEEDED, "sim")
        say("status loop: idle")
        report["idle"] = asyncio.run(same_loop(source, window, flood=False))
        say("status loop: same_loop")
        report["same_loop"] = asyncio.run(same_loop(source, window, flood=True))
        say("status loop: own_thread")
        report["own_thread"] = own_thread(source, window)
    report["load_after"] = os.getloadavg()
    write_result("status_loop", report)
    for case in ("idle", "same_loop", "own_thread"):
        r = report[case]
        served = f", endpoint {r['flood']['per_s']:.0f} responses/s" if "flood" in r else ""
        print(
            f"{case:10} 5 ms timer late by median {r['timer_late_ms']['median']} ms, p99 {r['p99_timer_late_ms']} ms; "
            f"/proc scan in a thread median {r['scan_ms']['median']} ms, p90 {r['scan_ms']['p90']} ms{served}"
        )
    print(f"load average before {report['load_before'][0]:.2f}, after {report['load_after'][0]:.2f} (1 min)")
    return report


if __name__ == "__main__":
    main()
