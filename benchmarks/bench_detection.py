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
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import (
    SCENARIOS,
    Driver,
    FaultClock,
    Scenario,
    bench_deployment,
    get_json,
    incidents_since,
    inject,
    kill_marked,
    parser,
    say,
    serving,
    summary,
    wait_for,
    write_result,
)
from tests.support.daemon import Deployment, PdDeployment, Traffic

DETECT_TIMEOUT_S = {"tool_markup_leak_under_load": 420.0}
DEFAULT_TIMEOUT_S = 150.0
F13_DURATION_S = 60.0  # the simulator's default `duration_s` of the long-prefill episode


def run_fault(name: str) -> dict[str, Any]:
    """One live injection: the fault's start, the first incident after it, and the latency between."""
    scen = SCENARIOS[name]
    timeout = DETECT_TIMEOUT_S.get(name, DEFAULT_TIMEOUT_S)
    with bench_deployment(**scen.deployment()) as dep:
        dep.start()
        dep.wait(serving, timeout=120, what="serving")
        armed_at = time.time()
        with FaultClock(dep.sim_url, name) as clock:
            inject(dep.sim_url, name)
            with Driver(dep.sim_url, scen.traffic, timeout, lambda: clock.seen is not None) as driver:
                found = wait_for(lambda: incidents_since(dep, armed_at), timeout, interval=0.2)
        start, source = clock.start(driver.first_at)
    return _first_incident(found, start, source, timeout)


def _first_incident(
    found: list[dict[str, Any]] | None, start: float | None, source: str, timeout: float
) -> dict[str, Any]:
    """The first incident after the fault's start: its kind, action, server and latency (or not detected)."""
    if not found or start is None:
        return {"detected": False, "timeout_s": timeout, "fault_start_source": source}
    first = found[0]
    return {
        "detected": True,
        "fault": first["fault"],
        "server": first.get("server"),
        "action": first.get("action"),
        "latency_s": round(float(first["detected_at"]) - start, 3),
        "supervisor_detection_latency_s": first.get("detection_latency_s"),
        "fault_start_source": source,
        "evidence": json.dumps(first.get("evidence"), default=str)[:400],
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
        found = incidents_since(dep, armed_at)
        return {
            "incident_faults": [str(i["fault"]) for i in found],
            "evidence": [json.dumps(i.get("evidence"), default=str)[:300] for i in found[:2]],
            "fault_started": clock.seen is not None,
            "observed_s": F13_DURATION_S + 20,
            "incidents": len(found),
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


PD_WEDGE = "pd_decode_transfer_wedge"


def run_pd_wedge() -> dict[str, Any]:
    """A prefill, a decode and a router (default probes); the decode wedges waiting for KV under router traffic."""
    with tempfile.TemporaryDirectory(prefix="sglsup-bench-") as tmp:
        dep = PdDeployment(Path(tmp))
        try:
            dep.start()
            dep.wait_all(lambda s: all(serving(v) for v in s.values()), timeout=180, what="all serving")
            decode_url = f"http://127.0.0.1:{dep.decode_port}"
            armed_at = time.time()
            with FaultClock(decode_url, PD_WEDGE) as clock:
                inject(decode_url, PD_WEDGE)
                router = f"http://127.0.0.1:{dep.router_port}"
                first_at = time.time()
                with Traffic(router, dep.model, period_s=0.3, max_requests=int(DEFAULT_TIMEOUT_S / 0.3)):
                    found = wait_for(lambda: incidents_since(dep, armed_at), DEFAULT_TIMEOUT_S, interval=0.2)
            start, source = clock.start(first_at)
        finally:
            dep.cleanup()
            kill_marked(dep.sim)
    return _first_incident(found, start, source, DEFAULT_TIMEOUT_S)


def _serving_now(dep: Deployment) -> dict[str, Any] | None:
    s = dep.server()
    return s if serving(s) else None


def probe_rate(window_s: float, dp: int = 1) -> dict[str, Any]:
    """Requests per second the daemon sends to an idle serving simulator (we send none but /sim/state), at
    `--dp-size dp`."""
    with bench_deployment(**Scenario("requests", dp=dp).deployment()) as dep:
        dep.start()
        dep.wait(serving, timeout=120, what="serving")
        before = get_json(dep.sim_url + "/sim/state")["requests_by_endpoint"]
        t0 = time.monotonic()
        time.sleep(window_s)  # the measurement window itself
        after = get_json(dep.sim_url + "/sim/state")["requests_by_endpoint"]
        elapsed = time.monotonic() - t0
    by = {k: after.get(k, 0) - before.get(k, 0) for k in after if k != "/sim/state"}  # not ours
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
        if name == PD_WEDGE:
            return run_pd_wedge()
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
    args = build_parser().parse_args(argv)
    reps = args.reps or (1 if args.quick else 5)
    window = 30.0 if args.quick else 120.0
    names = args.only or [*SCENARIOS, PD_WEDGE, "parser_misconfig"]
    results: dict[str, Any] = {}
    for name in names:
        runs = []
        for i in range(reps):
            say(f"detection: {name} run {i + 1}/{reps}")
            runs.append(_one(name))
        results[name] = _aggregate(name, runs)
    report: dict[str, Any] = {"quick": args.quick, "repetitions": reps, "scenarios": results}
    if not args.only:
        say(f"detection: probe rate over {window:.0f} s")
        report["probe_rate"] = probe_rate(window)
    if not args.only or "dp_rank_wedge" in names:
        say(f"detection: probe rate at --dp-size 2 over {window:.0f} s")
        report["probe_rate_dp2"] = probe_rate(window, dp=2)
    write_result("detection_partial" if args.only else "detection", report)
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
    for key in ("probe_rate", "probe_rate_dp2"):
        rate = report.get(key)
        if rate:
            print(f"{key}: {rate['per_s']} req/s over {rate['window_s']} s: {rate['by_endpoint']}")


def build_parser() -> argparse.ArgumentParser:
    """`--quick` and `--only`."""
    p = parser(__doc__)
    p.add_argument(
        "--only", nargs="*", choices=[*SCENARIOS, PD_WEDGE, "parser_misconfig"], help="run only these"
    )
    p.add_argument("--reps", type=int, default=None, help="runs per scenario (default 5, --quick 1)")
    return p


if __name__ == "__main__":
    main()
