"""Detection latency per fault scenario with DEFAULT probe settings, and the supervisor's own probe load.

Each run: the daemon supervises a simulated Kimi-K2.5 server (tp 2) with default probes; once it serves, the
fault is armed live (`POST /sim/fault`) and driven with traffic; latency = the incident's `detected_at` minus
the fault's `started_at` from `GET /sim/state` (for a crash that takes the simulator down before it can be read,
the send time of the request that fired it). Parser misconfiguration is measured from the daemon's start to
the `parser_misconfig` incident; health_false_negative_long_prefill is a zero-fault scenario (incidents should
stay 0 for its duration). The probe rate counts what the simulator received from the daemon alone.

Run: ``.venv/bin/python -m benchmarks.bench_detection [--quick] [--only NAME ...]``.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import time
from typing import Any

from benchmarks.common import (
    SCENARIOS,
    Driver,
    FaultClock,
    bench_deployment,
    get_json,
    incidents_since,
    inject,
    parser,
    say,
    serving,
    summary,
    wait_for,
    write_result,
)
from tests.e2e.support import Deployment

DETECT_TIMEOUT_S = {"tool_markup_leak_under_load": 420.0}
DEFAULT_TIMEOUT_S = 150.0
F13_DURATION_S = 60.0  # the simulator's default `duration_s` of the long-prefill episode
PARALLEL = ("tool_markup_leak_under_load", "health_false_negative_long_prefill")


def run_fault(name: str) -> dict[str, Any]:
    """One live injection: the fault's start, the first incident after it, and the latency between."""
    scen = SCENARIOS[name]
    timeout = DETECT_TIMEOUT_S.get(name, DEFAULT_TIMEOUT_S)
    with bench_deployment(extra_args=list(scen.extra_args)) as dep:
        dep.start()
        dep.wait(serving, timeout=120, what="serving")
        armed_at = time.time()
        with FaultClock(dep.sim_url, name) as clock:
            inject(dep.sim_url, name)
            with Driver(dep.sim_url, scen.traffic, timeout, lambda: clock.seen is not None) as driver:
                found = wait_for(lambda: incidents_since(dep, armed_at), timeout, interval=0.2)
        start, source = clock.start(driver.first_at)
        if not found or start is None:
            return {"detected": False, "timeout_s": timeout, "fault_start_source": source}
        first = found[0]
        return {
            "detected": True,
            "fault": first["fault"],
            "action": first.get("action"),
            "latency_s": round(float(first["detected_at"]) - start, 3),
            "supervisor_detection_latency_s": first.get("detection_latency_s"),
            "time_to_serving_s": first.get("time_to_serving_s"),
            "fault_start_source": source,
        }


def run_zero_fault(name: str) -> dict[str, Any]:
    """A fault that must NOT be acted on: count incidents over its episode (plus a margin)."""
    scen = SCENARIOS[name]
    with bench_deployment() as dep:
        dep.start()
        first = dep.wait(serving, timeout=120, what="serving")
        armed_at = time.time()
        with FaultClock(dep.sim_url, name) as clock:
            inject(dep.sim_url, name)
            with Driver(dep.sim_url, scen.traffic, max_s=F13_DURATION_S + 30):
                time.sleep(F13_DURATION_S + 20)  # observe the whole episode: a window, not a synchronisation
        now = dep.server()
        return {
            "fault_started": clock.seen is not None,
            "observed_s": F13_DURATION_S + 20,
            "incidents": len(incidents_since(dep, armed_at)),
            "restarts": int(now["restarts"]) - int(first["restarts"]),
            "state_after": now["state"],
        }


def run_parser_misconfig() -> dict[str, Any]:
    """Kimi-K2.5 launched without --tool-call-parser: seconds from the daemon's start to the incident."""
    with bench_deployment(parsers=(None, None)) as dep:
        launched = time.time()
        dep.start()
        found = wait_for(
            lambda: [i for i in incidents_since(dep, launched) if i["fault"] == "parser_misconfig"],
            DEFAULT_TIMEOUT_S,
            interval=0.2,
        )
        fixed = wait_for(lambda: _serving_now(dep), 120)
        if not found:
            return {"detected": False}
        return {
            "detected": True,
            "fault": "parser_misconfig",
            "latency_s": round(float(found[0]["detected_at"]) - launched, 3),
            "fixed_argv_has_parser": bool(fixed and "--tool-call-parser" in fixed["argv"]),
            "fault_start_source": "daemon_start",
        }


def _serving_now(dep: Deployment) -> dict[str, Any] | None:
    s = dep.server()
    return s if serving(s) else None


def probe_rate(window_s: float) -> dict[str, Any]:
    """Requests per second the daemon sends to an idle serving simulator (we send none but /sim/state)."""
    with bench_deployment() as dep:
        dep.start()
        dep.wait(serving, timeout=120, what="serving")
        before = get_json(dep.sim_url + "/sim/state")["requests_by_endpoint"]
        t0 = time.monotonic()
        time.sleep(window_s)  # the measurement window itself
        after = get_json(dep.sim_url + "/sim/state")["requests_by_endpoint"]
        elapsed = time.monotonic() - t0
    by = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    by["/sim/state"] = by.get("/sim/state", 0) - 1  # our own snapshot, counted before it was answered
    by = {k: v for k, v in by.items() if v}
    return {
        "window_s": round(elapsed, 1),
        "requests": sum(by.values()),
        "per_s": round(sum(by.values()) / elapsed, 3),
        "by_endpoint": by,
    }


def _one(name: str) -> dict[str, Any]:
    try:
        if name == "parser_misconfig":
            return run_parser_misconfig()
        if SCENARIOS[name].zero_fault:
            return run_zero_fault(name)
        return run_fault(name)
    except (AssertionError, RuntimeError, OSError) as exc:
        return {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}


def _aggregate(name: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    lat = [float(r["latency_s"]) for r in runs if r.get("detected")]
    out: dict[str, Any] = {"runs": runs, "detected": f"{len(lat)}/{len(runs)}"}
    if name in SCENARIOS and SCENARIOS[name].zero_fault:
        out["incidents_total"] = sum(int(r.get("incidents", 0)) for r in runs)
    else:
        out["latency_s"] = summary(lat)
        out["faults"] = sorted({str(r["fault"]) for r in runs if r.get("detected")})
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run every scenario (`--quick`: 1 run each, 30 s probe window) and print the figures."""
    p = build_parser()
    args = p.parse_args(argv)
    reps = 1 if args.quick else 5
    window = 30.0 if args.quick else 120.0
    names = args.only or [*SCENARIOS, "parser_misconfig"]
    results: dict[str, Any] = {}
    # The long, mostly idle runs (a 5-minute stream-canary wait, a 60 s prefill episode, the probe-rate
    # window) go to a small pool; the latency scenarios run one at a time next to them.
    with concurrent.futures.ThreadPoolExecutor(max_workers=3) as pool:
        rate = pool.submit(probe_rate, window) if not args.only else None
        background = {n: [pool.submit(_one, n) for _ in range(reps)] for n in names if n in PARALLEL}
        for name in [n for n in names if n not in PARALLEL]:
            runs = []
            for i in range(reps):
                say(f"detection: {name} run {i + 1}/{reps}")
                runs.append(_one(name))
            results[name] = _aggregate(name, runs)
        for name, futures in background.items():
            results[name] = _aggregate(name, [f.result() for f in futures])
        report: dict[str, Any] = {"quick": args.quick, "repetitions": reps, "scenarios": results}
        if rate is not None:
            report["probe_rate"] = rate.result()
    write_result("detection", report)
    print_table(report)
    return report


def print_table(report: dict[str, Any]) -> None:
    """Print one line per scenario."""
    print(f"{'scenario':40} {'detected':>8} {'median s':>9} {'p90 s':>7}  fault / note")
    for name, r in report["scenarios"].items():
        if "incidents_total" in r:
            print(f"{name:40} {'-':>8} {'-':>9} {'-':>7}  zero-fault: {r['incidents_total']} incidents")
            continue
        lat = r["latency_s"]
        med = "-" if lat["median"] is None else f"{lat['median']:.2f}"
        p90 = "-" if lat["p90"] is None else f"{lat['p90']:.2f}"
        print(f"{name:40} {r['detected']:>8} {med:>9} {p90:>7}  {', '.join(r['faults'])}")
    rate = report.get("probe_rate")
    if rate:
        print(f"probe load: {rate['per_s']} req/s over {rate['window_s']} s: {rate['by_endpoint']}")


def build_parser() -> argparse.ArgumentParser:
    """`--quick` and `--only`."""
    p = parser(__doc__)
    p.add_argument("--only", nargs="*", choices=[*SCENARIOS, "parser_misconfig"], help="run only these")
    return p


if __name__ == "__main__":
    main()
