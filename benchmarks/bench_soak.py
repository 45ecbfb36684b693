"""Chaos soak: random faults from the scenario catalogue against a simulated tp-8 server under traffic.

For `--minutes` (default 30): the daemon supervises a simulated Kimi-K2.5 server on 8 stand-in GPUs with light
background traffic. In a loop: wait until it serves, watch a quiet window (`--quiet`, default 30 s; any incident
there is a *false incident*), arm a random scenario live (`POST /sim/fault`, seeded by `--seed`), drive it, wait
for the incident and then for `serving` again (recovered) or for `failed`/`degraded` (escalated; a failed server
is restarted through the control endpoint so the soak goes on). Every 5 s the daemon's RSS and open file
descriptors (`/proc/<pid>/fd`) are sampled. At the end the daemon is stopped with SIGTERM and every process of the
simulated host still alive is an orphan.

Faults whose whole point is a slow or persistent state are left out of the random pool: the zero-fault long
prefill and the under-load markup leak (it leaves the server `degraded` until an operator acts, by design).
The restart budget is raised (a soak is hours of faults in a row; the default budget would turn the fifth
restart in ten minutes into `failed`, which `bench_detection` and the e2e tests cover).

Run: ``nice .venv/bin/python -m benchmarks.bench_soak [--minutes N] [--seed S] [--quiet S]``.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import threading
import time
from pathlib import Path
from typing import Any

import psutil

from benchmarks.common import (
    MODEL,
    SCENARIOS,
    Driver,
    FaultClock,
    bench_deployment,
    incidents_since,
    inject,
    marked,
    parser,
    say,
    serving,
    summary,
    wait_for,
    write_result,
)
from tests.support.daemon import Deployment, Traffic

POOL = sorted(n for n, s in SCENARIOS.items() if not s.zero_fault and s.traffic == "requests")
DETECT_TIMEOUT_S = 180.0
RECOVER_TIMEOUT_S = 240.0
SAMPLE_S = 5.0
WINDOW_S = 300.0  # "first vs last 5 minutes" (a third of the run when shorter than 15 minutes)
SOAK_PROBES = {"canary_period_s": 60, "stream_canary_period_s": 600}
SOAK_RESTART = {"restarts": 10000, "window_s": 600, "initial_s": 0.5, "max_s": 5.0}


class Sampler:
    """RSS and open fds of one process every `SAMPLE_S`, in a thread, until stopped."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.samples: list[tuple[float, int, int]] = []  # (monotonic, rss bytes, open fds)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        proc = psutil.Process(self.pid)
        while not self._stop.is_set():
            try:
                fds = len(os.listdir(f"/proc/{self.pid}/fd"))
                self.samples.append((time.monotonic(), proc.memory_info().rss, fds))
            except (OSError, psutil.Error):
                return
            self._stop.wait(SAMPLE_S)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def windows(self, span: float) -> dict[str, Any]:
        """Mean RSS (MiB) and fds of the first and the last `span` seconds."""
        if not self.samples:
            return {}
        t0, t1 = self.samples[0][0], self.samples[-1][0]
        first = [s for s in self.samples if s[0] <= t0 + span]
        last = [s for s in self.samples if s[0] >= t1 - span]

        def mean(rows: list[tuple[float, int, int]], i: int) -> float:
            return sum(r[i] for r in rows) / len(rows)

        rss_first, rss_last = mean(first, 1) / 2**20, mean(last, 1) / 2**20
        return {
            "window_s": round(span),
            "rss_first_mib": round(rss_first, 1),
            "rss_last_mib": round(rss_last, 1),
            "rss_change_pct": round(100 * (rss_last - rss_first) / rss_first, 1),
            "fds_first": round(mean(first, 2), 1),
            "fds_last": round(mean(last, 2), 1),
            "fds_max": max(s[2] for s in self.samples),
            # the floor: the daemon's standing fds between probes (in-flight probe sockets come and go)
            "fds_min_first": min(r[2] for r in first),
            "fds_min_last": min(r[2] for r in last),
            "samples": len(self.samples),
            "per_window": self.series(span),
        }

    def series(self, span: float) -> list[dict[str, float]]:
        """Mean RSS (MiB), mean and least fds of each consecutive `span` seconds: a trend, not two points."""
        t0 = self.samples[0][0]
        out = []
        for k in range(int((self.samples[-1][0] - t0) // span) + 1):
            rows = [r for r in self.samples if t0 + k * span <= r[0] < t0 + (k + 1) * span]
            if rows:
                rss = sum(r[1] for r in rows) / len(rows) / 2**20
                fds = sum(r[2] for r in rows) / len(rows)
                out.append(
                    {"rss_mib": round(rss, 1), "fds": round(fds, 1), "fds_min": min(r[2] for r in rows)}
                )
        return out


def _settled(dep: Deployment) -> dict[str, Any] | None:
    """The server's status once it is serving again, or failed / degraded."""
    server = dep.server()
    return server if server["state"] in ("serving", "failed", "degraded") else None


def one_fault(dep: Deployment, name: str) -> dict[str, Any]:
    """Arm `name`, drive it, and follow the server to serving (recovered) or failed/degraded (escalated)."""
    scen = SCENARIOS[name]
    armed = time.time()
    with FaultClock(dep.sim_url, name) as clock:
        inject(dep.sim_url, name)
        with Driver(dep.sim_url, scen.traffic, DETECT_TIMEOUT_S, lambda: bool(incidents_since(dep, armed))):
            found = wait_for(lambda: incidents_since(dep, armed), DETECT_TIMEOUT_S, interval=0.2)
    if not found:
        # a fault whose trigger needs what an earlier fallback took away (overlap on) never fires: prevented
        outcome = "undetected" if clock.seen is not None else "prevented"
        flags = [a for a in dep.server().get("argv", []) if a.startswith("--disable")]
        return {"scenario": name, "outcome": outcome, "fallback_flags": flags}
    incident = found[0]
    end = wait_for(lambda: _settled(dep), RECOVER_TIMEOUT_S)
    state = end["state"] if end else "stuck"
    outcome = {"serving": "recovered", "failed": "escalated", "degraded": "escalated"}.get(state, "stuck")
    if state in ("failed", "degraded"):
        dep.post("/control/restart", {"reason": "soak: next fault"}, token=dep.token)
    return {
        "scenario": name,
        "fault": incident["fault"],
        "outcome": outcome,
        "state": state,
        "detection_s": round(float(incident["detected_at"]) - armed, 2),
        "to_serving_s": round(time.time() - armed, 2) if outcome == "recovered" else None,
    }


def soak(minutes: float, seed: int, quiet_s: float) -> dict[str, Any]:
    """The whole soak; returns the report."""
    rng = random.Random(seed)
    faults: list[dict[str, Any]] = []
    false_incidents: list[dict[str, Any]] = []
    with bench_deployment(tp=8, probes=SOAK_PROBES, restart=SOAK_RESTART) as dep:
        daemon = dep.start()
        dep.wait(serving, timeout=180, what="serving")
        end = time.monotonic() + 60 * minutes
        with Sampler(daemon.pid) as sampler, Traffic(dep.sim_url, MODEL, 1.0, int(60 * minutes) + 60):
            while time.monotonic() < end:
                if not wait_for(lambda: serving(dep.server()), RECOVER_TIMEOUT_S):
                    say("soak: server not serving; restarting it")
                    dep.post("/control/restart", {"reason": "soak: not serving"}, token=dep.token)
                    continue
                quiet_from = time.time()
                time.sleep(quiet_s)  # a window observed for false incidents, not a synchronisation
                false_incidents += incidents_since(dep, quiet_from)
                if time.monotonic() >= end:
                    break
                name = rng.choice(POOL)
                say(f"soak: {len(faults) + 1}: {name}")
                faults.append(one_fault(dep, name))
                say(f"soak:   {faults[-1]}")
        figures = sampler.windows(min(WINDOW_S, 60 * minutes / 3))
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=300)
        time.sleep(2.0)  # let the last reaped processes vanish from /proc before counting
        orphans = [f"{p.pid} {p.name()}" for p in marked(dep.sim)]
    outcomes = [f["outcome"] for f in faults]
    return {
        "minutes": minutes,
        "seed": seed,
        "faults": len(faults),
        "recovered": outcomes.count("recovered"),
        "escalated": outcomes.count("escalated"),
        "undetected": outcomes.count("undetected"),
        "prevented": outcomes.count("prevented"),
        "stuck": outcomes.count("stuck"),
        "false_incidents": [f"{i['fault']}: {i.get('reason', '')[:120]}" for i in false_incidents],
        "orphans": orphans,
        "daemon": figures,
        "detection_s": summary([f["detection_s"] for f in faults if "detection_s" in f]),
        "to_serving_s": summary([f["to_serving_s"] for f in faults if f.get("to_serving_s") is not None]),
        "runs": faults,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the soak and print the figures."""
    args = build_parser().parse_args(argv)
    minutes = 3.0 if args.quick else args.minutes
    report = soak(minutes, args.seed, args.quiet)
    path = write_result("soak", report)
    d = report["daemon"]
    print(
        f"soak {minutes:g} min (seed {args.seed}): {report['faults']} faults, {report['recovered']} recovered, "
        f"{report['escalated']} escalated, {report['undetected']} undetected, {report['prevented']} prevented "
        f"(a fallback flag in place), {report['stuck']} stuck; false incidents {len(report['false_incidents'])}; "
        f"orphans {len(report['orphans'])}"
    )
    if d:
        print(
            f"daemon RSS {d['rss_first_mib']} → {d['rss_last_mib']} MiB ({d['rss_change_pct']:+} %, "
            f"{d['window_s']} s windows); fds {d['fds_first']} → {d['fds_last']} (max {d['fds_max']}; least "
            f"{d['fds_min_first']} → {d['fds_min_last']})"
        )
    print(f"detection s {report['detection_s']}; to serving s {report['to_serving_s']}; {Path(path).name}")
    return report


def build_parser() -> argparse.ArgumentParser:
    """`--minutes`, `--seed`, `--quiet`, `--quick`."""
    p = parser(__doc__)
    p.add_argument("--minutes", type=float, default=30.0, help="length of the soak (default 30)")
    p.add_argument("--seed", type=int, default=1, help="seed of the fault sequence")
    p.add_argument(
        "--quiet", type=float, default=30.0, help="seconds watched for false incidents between faults"
    )
    return p


if __name__ == "__main__":
    main()
