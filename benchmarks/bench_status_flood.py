"""What a flood of the status endpoint costs supervision (issue 23).

A serving simulated server (tp 2, restart backoff 0) and a journal of 500 old incidents. Each round SIGKILLs the
simulated main process twice: once while a busy process spins one core (the baseline: the same CPU taken away,
no flood), once while 300 clients loop on `/metrics`, `/status` and `/incidents?limit=500`. Detection and serving
again are read from the journal (`detected_at`, `recovered_at` minus the kill), not through the flooded endpoint.
While flooded: the responses per second the endpoint serves, the daemon's CPU % and RSS (sampled every 0.5 s),
and how long one `/healthz` takes.

Configurations of `[supervisor.http]`: `default` (the shipped limits), `unpaced` (no practical request rate
limit), `uncached` (`cache_s = 0`: every request rendered) and `unbounded` (both, and no practical connection
limit: every request rendered on the loop, as before issue 23).

Run: ``.venv/bin/python -m benchmarks.bench_status_flood [--quick] [--rounds N] [--only CONFIG ...]``.
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

from benchmarks.common import kill_marked, parser, say, serving, summary, write_result
from tests.hardening.flood import NO_BACKOFF, Busy, Flood, FloodDeployment, kill_main
from tests.support.http import http

CONFIGS: dict[str, dict[str, Any]] = {
    "default": {},
    "unpaced": {"max_requests_per_s": 1e9},
    "uncached": {"cache_s": 0},
    "unbounded": {"cache_s": 0, "max_connections": 65536, "max_requests_per_s": 1e9},
}
CLIENTS = 300
HEALTHZ_TIMEOUT_S = 30
QUIET_CPU_PERCENT = 30
WARM_RESPONSES = 200  # the flood is at full pace once it has had this many answers


class Sampler:
    """The daemon's CPU % and RSS every 0.5 s while running."""

    def __init__(self, pid: int) -> None:
        self.proc = psutil.Process(pid)
        self.cpu: list[float] = []
        self.rss: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        self.proc.cpu_percent(None)
        while not self._stop.wait(0.5):
            self.cpu.append(self.proc.cpu_percent(None))
            self.rss.append(self.proc.memory_info().rss / 2**20)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def _flooded_fault(dep: FloodDeployment, out: dict[str, list[float]]) -> None:
    assert dep.daemon is not None
    with Flood(dep.http_port, clients=CLIENTS) as flood, Sampler(dep.daemon.pid) as sampler:
        deadline = time.monotonic() + 60
        while flood.stats.responses < WARM_RESPONSES and time.monotonic() < deadline:
            time.sleep(0.05)  # the flood warming up
        t0 = time.monotonic()
        try:
            ok = http(dep.url + "/healthz", timeout=HEALTHZ_TIMEOUT_S).status == 200
        except TimeoutError:
            ok = False
        out["healthz_s"].append(time.monotonic() - t0)
        out["healthz_ok"].append(float(ok))
        detect, back = kill_main(dep)
        served_from, responses_from = time.monotonic(), flood.stats.responses
    out["detect"].append(detect)
    out["serving"].append(back)
    out["rps"].append((flood.stats.responses - responses_from) / max(1e-9, flood.stats.ended - served_from))
    out["cpu"] += sampler.cpu
    out["rss"] += sampler.rss


def _settle(pid: int) -> None:
    """Wait (at most 120 s) until the daemon is quiet again: it may still answer requests of a flood gone."""
    proc = psutil.Process(pid)
    proc.cpu_percent(None)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        time.sleep(0.5)  # the sampling window
        if proc.cpu_percent(None) < QUIET_CPU_PERCENT:
            return


def run(name: str, rounds: int) -> dict[str, Any]:
    """Interleaved rounds of (busy fault, flooded fault) under one configuration."""
    keys = ("detect", "serving", "rps", "cpu", "rss", "healthz_s", "healthz_ok")
    flooded: dict[str, list[float]] = {k: [] for k in keys}
    busy: dict[str, list[float]] = {"detect": [], "serving": []}
    with tempfile.TemporaryDirectory(prefix="sglsup-bench-") as tmp:
        dep = FloodDeployment(Path(tmp), restart=NO_BACKOFF, http=CONFIGS[name])
        try:
            dep.seed_journal()
            daemon = dep.start()
            dep.wait(serving, timeout=120, what="serving")
            for i in range(rounds):
                say(f"status flood ({name}): round {i + 1}/{rounds}")
                with Busy():
                    detect, back = kill_main(dep)
                busy["detect"].append(detect)
                busy["serving"].append(back)
                _flooded_fault(dep, flooded)
                _settle(daemon.pid)
        finally:
            dep.cleanup()
            kill_marked(dep.sim)
    return {
        "config": CONFIGS[name],
        "clients": CLIENTS,
        "busy": {"detection_s": summary(busy["detect"]), "serving_again_s": summary(busy["serving"])},
        "flooded": {
            "detection_s": summary(flooded["detect"]),
            "serving_again_s": summary(flooded["serving"]),
            "responses_per_s": summary(flooded["rps"]),
            "daemon_cpu_percent": summary(flooded["cpu"]),
            "daemon_rss_mib": summary(flooded["rss"]),
            "healthz_s": summary(flooded["healthz_s"]),
            "healthz_200": all(flooded["healthz_ok"]),
        },
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run each configuration and print the figures."""
    p = parser(__doc__)
    p.add_argument("--rounds", type=int, default=None, help="faults per case (default 5, --quick 2)")
    p.add_argument("--only", choices=sorted(CONFIGS), action="append", default=None)
    args = p.parse_args(argv)
    rounds = args.rounds or (2 if args.quick else 5)
    report: dict[str, Any] = {"quick": args.quick, "rounds": rounds, "load_before": os.getloadavg()}
    for name in args.only or list(CONFIGS):
        report[name] = run(name, rounds)
        write_result("status_flood", report)
    report["load_after"] = os.getloadavg()
    write_result("status_flood", report)
    print_report(report)
    return report


def print_report(report: dict[str, Any]) -> None:
    """One block per configuration."""
    for name in CONFIGS:
        if name not in report:
            continue
        r = report[name]
        b, f = r["busy"], r["flooded"]
        ratio = f["serving_again_s"]["median"] / b["serving_again_s"]["median"]
        print(f"== {name} {r['config']}")
        print(
            f"busy core   detection median {b['detection_s']['median']} s, serving again {b['serving_again_s']['median']} s"
        )
        print(
            f"flooded     detection median {f['detection_s']['median']} s, serving again "
            f"{f['serving_again_s']['median']} s ({ratio:.2f}x)"
        )
        print(
            f"endpoint    {f['responses_per_s']['median']} responses/s; daemon CPU {f['daemon_cpu_percent']['median']} % "
            f"(max {f['daemon_cpu_percent']['max']}), RSS {f['daemon_rss_mib']['median']} MiB (max "
            f"{f['daemon_rss_mib']['max']}); /healthz {f['healthz_s']['median']} s, all 200: {f['healthz_200']}"
        )
    before, after = report["load_before"], report["load_after"]
    print(f"load average before {before[0]:.2f}, after {after[0]:.2f} (1 min)")


if __name__ == "__main__":
    main()
