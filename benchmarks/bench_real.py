"""Figures on the real SGLang 0.5.23 server (CPU, the tiny scripted model): detection, recovery, footprint, load.

One daemon supervises one real server (tp 2 by default; gloo collectives). In order, on the same deployment:
(a) footprint: the daemon's RSS and CPU % sampled every second while it supervises the serving server, and the
probe load (requests per minute the server logs from the daemon: /health, /metrics, canaries);
(b) faults, each followed by the relaunch to serving: SIGKILL of `scheduler_TP1` (crash), SIGKILL of the main
process (crash), SIGSTOP of `scheduler_TP1` with a request decoding (collective_hang), SIGSTOP of every rank with
requests decoding (decode_wedge). Per fault: seconds from the injection until `/status` shows the incident
(outside view), the daemon's own `detection_latency_s` and `time_to_serving_s`, and the kind it diagnosed.
Figures only; nothing asserted. Needs the serving venv and the models (built by the real-serving tier).

`--load`: the product's DEFAULT probe settings instead of the real tier's tuned ones (the load canary off: the
scripted model answers Paris to every city it asks), and SGLang's own benchmark client (`sglang.benchmark.serving`,
random ids, 8 concurrent, 64-token prompts, 32-token outputs). First a clean run (incidents, requests served);
then each fault idle — an idle freeze (SIGSTOP of every rank with nothing in flight; `--freezes` times, for the
p50), the collective hang, the decode wedge, the rank kill — and under the client's load at 2 requests/s (the
wedge and the rank kill): seconds from the injection to the incident in `/status`, the first action, seconds
until serving again, and the requests the client saw fail.

    .venv/bin/python -m benchmarks.bench_real [--quick] [--tp 1|2] [--load [--freezes N] [--only NAME ...]]
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from benchmarks.common import parser, say, write_result
from tests.real_serving.load import ServingLoad
from tests.real_serving.support import (
    NO_LOAD_CANARY,
    READY_S,
    SCRIPTED_REASONING,
    InFlight,
    RealDeployment,
    metric,
    serving,
    tiny_models,
    wait_running,
)
from tests.support.real_sglang import real_serving_python
from tests.support.wait import wait_for

_REQUEST = re.compile(r'"(GET|POST) (/[a-z_/]+)[^"]*" \d{3}')


def _setup() -> tuple[Path, Path]:
    python = real_serving_python()
    return python, tiny_models(python)


def footprint(dep: RealDeployment, daemon_pid: int, window_s: float) -> dict[str, Any]:
    """(a) Daemon RSS / CPU % and the probe requests the server logged, over `window_s` of serving."""
    log = dep.root / "log" / "real.log"
    mark = len(log.read_text(errors="replace").splitlines())
    proc = psutil.Process(daemon_pid)
    proc.cpu_percent(None)
    rss: list[float] = []
    cpu: list[float] = []
    t0 = time.monotonic()
    while time.monotonic() - t0 < window_s:
        time.sleep(1.0)  # the sampling period
        cpu.append(proc.cpu_percent(None))
        rss.append(proc.memory_info().rss / 2**20)
    elapsed = time.monotonic() - t0
    counts: dict[str, int] = {}
    for line in log.read_text(errors="replace").splitlines()[mark:]:
        found = _REQUEST.search(line)
        if found:
            key = f"{found.group(1)} {found.group(2)}"
            counts[key] = counts.get(key, 0) + 1
    return {
        "window_s": round(elapsed, 1),
        "rss_mib": {"median": round(statistics.median(rss), 1), "max": round(max(rss), 1)},
        "cpu_percent": {"mean": round(statistics.fmean(cpu), 2), "max": round(max(cpu), 1)},
        "probe_requests_per_min": {k: round(v * 60 / elapsed, 1) for k, v in sorted(counts.items())},
    }


def fault(
    dep: RealDeployment,
    name: str,
    inject: Callable[[dict[str, Any]], None],
    ready_s: float,
    load: ServingLoad | None = None,
) -> dict[str, Any]:
    """Inject one fault on the serving server; time the incident's appearance and the return to serving.

    With `load`, the client runs through the fault (started once serving, the fault injected once requests
    run) and its failed requests are counted when it ends."""
    first = dep.wait(serving, timeout=ready_s, what="serving")
    before = (first.get("last_incident") or {}).get("id")
    busy = name in ("collective_hang", "decode_wedge") and load is None
    if name == "idle_freeze":
        wait_idle(dep)
    if load is not None:
        load.start()
        wait_running(dep.sim_url, 2, timeout=300)
    with InFlight(dep.sim_url, n=2) if busy else contextlib.nullcontext():
        if busy:
            wait_running(dep.sim_url, 1, timeout=120)
        t0 = time.monotonic()
        inject(first)
        seen = dep.wait(
            lambda s: (s.get("last_incident") or {}).get("id") not in (None, before),
            timeout=ready_s,
            what=name,
        )
        outside = time.monotonic() - t0
        again = dep.wait(lambda s: serving(s) and s["pid"] != first["pid"], timeout=ready_s, what="serving")
    incident = again["last_incident"]
    out = {
        "injected": name,
        "under_load": load is not None,
        "diagnosed": seen["last_incident"]["fault"],
        "action": incident.get("action"),
        "reason": (incident.get("reason") or "")[:200],
        "seen_in_status_s": round(outside, 2),
        "detection_latency_s": incident.get("detection_latency_s"),
        "time_to_serving_s": incident.get("time_to_serving_s"),
        "outside_to_serving_s": round(time.monotonic() - t0, 1),
    }
    if load is not None:
        try:
            out["client"] = load.wait(timeout_s=1800)
        finally:
            load.stop()
    return out


def wait_idle(dep: RealDeployment) -> None:
    """Serving, no canary of ours in flight and nothing running on the server."""

    def quiet() -> bool:
        s = dep.server()
        probes = s.get("probes") or {}
        ours = {"canary_tool", "canary_stream"} & set(probes.get("in_flight", ()))
        return serving(s) and not ours and metric(dep.sim_url, "sglang:num_running_reqs") == 0

    wait_for(quiet, READY_S, "serving and idle", interval=0.5)


def load_mode(
    dep: RealDeployment, python: Path, quick: bool, freezes: int, only: list[str]
) -> dict[str, Any]:
    """`--load`: the clean client run, then each fault idle (the idle freeze `freezes` times) and under load
    (`only`: these faults, `load:` before the name for one under load)."""
    report: dict[str, Any] = {"defaults": True}
    dep.wait(serving, timeout=READY_S, what="serving")
    incidents = len(dep.incidents())
    clean = ServingLoad(python, dep.sim_url, dep.model_dir, dep.root / "clean.jsonl", requests=64).start()
    try:
        report["clean"] = {**clean.wait(timeout_s=1800), "incidents": len(dep.incidents()) - incidents}
    finally:
        clean.stop()
    say(f"clean {report['clean']}")

    def ranks(s: dict[str, Any]) -> dict[str, psutil.Process]:
        return dep.ranks(s["pid"])

    def stop_every_rank(s: dict[str, Any]) -> None:
        for proc in ranks(s).values():
            proc.suspend()

    idle: list[tuple[str, Callable[[dict[str, Any]], None]]] = [
        ("idle_freeze", stop_every_rank),
        ("collective_hang", lambda s: ranks(s)["sglang::scheduler_TP1"].suspend()),
        ("decode_wedge", stop_every_rank),
        ("rank_sigkill", lambda s: ranks(s)["sglang::scheduler_TP1"].kill()),
    ]
    loaded = [("decode_wedge", stop_every_rank), ("rank_sigkill", idle[3][1])]
    report["faults"] = []
    for name, inject in [*[idle[0]] * (freezes - 1), *idle[: 1 if quick else None]]:
        if only and name not in only:
            continue
        report["faults"].append(fault(dep, name, inject, READY_S))
        say(f"fault {report['faults'][-1]}")
    seen = sorted(f["seen_in_status_s"] for f in report["faults"] if f["injected"] == "idle_freeze")
    if seen:
        report["idle_freeze_p50_s"] = statistics.median(seen)
    for i, (name, inject) in enumerate(loaded[: 1 if quick else None]):
        if only and f"load:{name}" not in only:
            continue
        client = ServingLoad(
            python, dep.sim_url, dep.model_dir, dep.root / f"load-{i}.jsonl", requests=360, rate=2.0
        )
        report["faults"].append(fault(dep, name, inject, READY_S, load=client))
        say(f"fault {report['faults'][-1]}")
    return report


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run (a) and (b) and print the figures."""
    p = parser(__doc__)
    p.add_argument("--tp", type=int, default=2, choices=(1, 2))
    p.add_argument("--load", action="store_true", help="default probe settings, SGLang's client load (tp 2)")
    p.add_argument(
        "--freezes", type=int, default=3, help="--load: idle freezes for the p50 (each a relaunch)"
    )
    p.add_argument("--only", nargs="*", default=[], help="--load: these faults (load:NAME under load)")
    args = p.parse_args(argv)
    python, models = _setup()
    report: dict[str, Any] = {"tp": 2 if args.load else args.tp, "quick": args.quick}
    title = "sglang::scheduler_TP1" if args.tp > 1 else "sglang::scheduler"
    with tempfile.TemporaryDirectory(prefix="sglsup-bench-real-") as tmp:
        if args.load:
            dep = RealDeployment(
                Path(tmp), tp=2, python=python, models=models, model_name=SCRIPTED_REASONING,
                parsers=("qwen", "qwen3"), tuned_probes=False, probes=NO_LOAD_CANARY,
                restart={"restarts": 20},  # the default budget (5 in 600 s) is spent by the sixth fault
            )  # fmt: skip
        else:
            dep = RealDeployment(Path(tmp), tp=args.tp, python=python, models=models, parsers=("qwen", None))
        try:
            daemon = dep.start()
            if args.load:
                freezes = 1 if args.quick else args.freezes
                report.update(load_mode(dep, python, args.quick, freezes, args.only))
                return finish(report)
            dep.wait(serving, timeout=READY_S, what="serving")
            report["footprint"] = footprint(dep, daemon.pid, 20.0 if args.quick else 60.0)
            say(f"footprint {report['footprint']}")

            def stop_all(s: dict[str, Any]) -> None:
                for t, proc in dep.ranks(s["pid"]).items():
                    if t.startswith("sglang::scheduler"):
                        proc.suspend()

            plan: list[tuple[str, Callable[[dict[str, Any]], None]]] = [
                ("rank_sigkill", lambda s: dep.ranks(s["pid"])[title].kill()),
                ("main_sigkill", lambda s: os.kill(s["pid"], signal.SIGKILL)),
                ("decode_wedge", stop_all),
            ]
            if args.tp > 1:
                plan.append(("collective_hang", lambda s: dep.ranks(s["pid"])[title].suspend()))
            report["faults"] = []
            for name, inject in plan[: 2 if args.quick else None]:
                report["faults"].append(fault(dep, name, inject, READY_S))
                say(f"fault {report['faults'][-1]}")
        except (AssertionError, OSError, psutil.Error, KeyError) as exc:
            report["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        finally:
            dep.cleanup()
    return finish(report)


def finish(report: dict[str, Any]) -> dict[str, Any]:
    """Write the figures (`real`, or `real_load` for `--load`) and print them."""
    write_result("real_load" if report.get("defaults") else "real", report)
    print_report(report)
    return report


def print_report(report: dict[str, Any]) -> None:
    """One line per figure."""
    fp = report.get("footprint")
    if fp:
        print(
            f"footprint (tp {report['tp']}): daemon RSS median {fp['rss_mib']['median']} MiB, CPU "
            f"{fp['cpu_percent']['mean']} % mean (max {fp['cpu_percent']['max']}) over {fp['window_s']} s; "
            f"probe load per minute: {fp['probe_requests_per_min']}"
        )
    if "clean" in report:
        print(f"clean client run (defaults): {report['clean']}")
    if "idle_freeze_p50_s" in report:
        print(f"idle freeze: p50 {report['idle_freeze_p50_s']} s from the SIGSTOP to the incident in /status")
    for f in report.get("faults", []):
        client = f.get("client")
        print(
            f"{f['injected']:16}{' under load' if f.get('under_load') else ''} diagnosed {f['diagnosed']:16} seen in "
            f"/status after {f['seen_in_status_s']} s, detection latency {f['detection_latency_s']} s, first action "
            f"{f.get('action')!r}, serving again after {f['outside_to_serving_s']} s (daemon: {f['time_to_serving_s']} s)"
            + (f"; client: {client['failed']}/{client['requests']} failed" if client else "")
        )
    if "error" in report:
        print(f"error: {report['error']}")


if __name__ == "__main__":
    main()
