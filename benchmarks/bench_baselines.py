"""The same faults against what an operator runs today, each a small faithful model of the tool's defaults.

Tools (defaults from `reference/anchors.md`; a "container" / "cgroup" is the set of processes that carry the
run's simulator state dir in their environment):

- `supervisor`: sglang-supervisor itself, default probes and default restart backoff (the first restart of a
  streak at once, then 5 s, 10 s …).
- `k8s`: liveness `httpGet /health` every 10 s, 3 consecutive failures ⇒ SIGTERM the container's main process,
  30 s grace, SIGKILL the container; a container exit restarts it too; restart delays 0, 10, 20, 40 … s.
  Its timeoutSeconds is raised to 25 s (above SGLang's own 20 s health wait): with the default 1 s every probe of
  SGLang's `/health` (≥ 1 s by design) fails — `k8s_default` shows that on a healthy server.
- `systemd`: `Restart=on-failure` acts only on the main process's exit (not exit 0, SIGTERM, SIGINT, SIGHUP,
  SIGPIPE); `KillMode=control-group` SIGTERMs the rest of the unit, SIGKILL after TimeoutStopSec 90 s; RestartSec
  100 ms; more than 5 starts in 10 s ⇒ start-limit-hit.
- `sglang_watchdog`: SGLang alone, `--watchdog-timeout` scaled from 300 s to 30 s (so its detection figures are
  ten times shorter than with the default); it stops a stuck server itself and relaunches nothing.
- `script`: `curl -sf -m 10 /health` every 10 s; two failures in a row ⇒ `pkill -f sglang.launch_server` (SIGTERM
  to the processes whose command line matches: the main process — the ranks are titled `sglang::scheduler_TP*`),
  `sleep 5`, relaunch.

Per (scenario, tool): detected (the tool acted), seconds from the fault's start, seconds until the server is
correct again (`/health` 200 and a tool call parsed in stream and non-stream — 16 streams for the leak), whether
a relaunch reached serving. "Correct again" is the start of the earliest passing check; once the tool has acted a
check starts every 0.1 s (up to eight side by side), so every tool is timed at the same 0.1 s resolution. Each pair gets at most `--bound` seconds (120; `--quick` 45).

Run: ``.venv/bin/python -m benchmarks.bench_baselines [--quick] [--bound S] [--only SCENARIO ...]``.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import os
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.baseline_tools import BASELINES, Baseline
from benchmarks.common import (
    SCENARIOS,
    Driver,
    FaultClock,
    SimHost,
    bench_deployment,
    correct,
    http_status,
    incidents_since,
    inject,
    parser,
    say,
    wait_for,
    write_result,
)
from tests.support.daemon import Deployment

ORPHANS = "orphans_hold_gpu_and_ports"
PARSER = "parser_misconfig"
HEALTHY = "healthy"
FAULTS = [*SCENARIOS, ORPHANS, PARSER, HEALTHY]
PRODUCT_RESTART = {"initial_s": 5, "max_s": 300}
# The supervisor's stream canary first runs `stream_canary_first_s` (30 s) after serving; room for one retry.
LONG_BOUND_S = {"tool_markup_leak_under_load": 150.0}
ORACLE_PERIOD_S = 0.1
ORACLE_IN_FLIGHT = 8


def tools_for(scenario: str) -> list[str]:
    """k8s with the default 1 s probe timeout only on the healthy server (it restarts it in a loop)."""
    base = ["supervisor", "k8s", "systemd", "sglang_watchdog", "script"]
    return [*base, "k8s_default"] if scenario == HEALTHY else base


class Subject:
    """One tool managing one server in a temporary directory: the simulator URL, detection, launches."""

    def __init__(self, tool: str, scenario: str, root: Path) -> None:
        scen = SCENARIOS.get(scenario)
        extra = list(scen.extra_args) if scen else []
        env = {"SGLANG_SIM_SCENARIO": ORPHANS} if scenario == ORPHANS else {}
        parsers = scenario != PARSER
        self.tool = tool
        self.dep: Deployment | None = None
        self.baseline: Baseline | None = None
        self._deployment: Any = None
        if tool == "supervisor":
            names = ("kimi_k2", "kimi_k2") if parsers else (None, None)
            self._deployment = bench_deployment(
                extra_args=extra, env=env, restart=PRODUCT_RESTART, parsers=names
            )
            self.dep = self._deployment.__enter__()
            self.url = self.dep.sim_url
        else:
            kind = BASELINES[tool]
            host = SimHost(root, env, extra, parsers, kind.watchdog)
            self.baseline = kind(host)
            self.url = host.url

    def start(self) -> None:
        """Launch the server under the tool."""
        if self.dep is not None:
            self.dep.start()
        elif self.baseline is not None:
            self.baseline.host.launch()
            self.baseline.thread.start()

    def actions_since(self, since: float) -> list[tuple[float, str]]:
        """What the tool did after `since` (wall time); nothing while the daemon's HTTP is not up yet."""
        if self.dep is not None:
            try:
                found = incidents_since(self.dep, since)
            except (OSError, ValueError):
                return []
            return [(float(i["detected_at"]), f"{i['fault']}: {i.get('action')}") for i in found]
        assert self.baseline is not None
        return [a for a in self.baseline.actions if a[0] >= since]

    def main_pid(self) -> int | None:
        """The PID of the SGLang main process now."""
        if self.dep is not None:
            pid = self.dep.server().get("pid")
            return int(pid) if pid else None
        assert self.baseline is not None
        return self.baseline.host.proc.pid

    def launches(self) -> int:
        """How many servers were launched in all."""
        if self.dep is not None:
            return 1 + int(self.dep.server()["restarts"])
        assert self.baseline is not None
        return len(self.baseline.host.procs)

    def close(self) -> None:
        """Stop the tool and kill everything of the run."""
        if self.baseline is not None:
            self.baseline.stop.set()
            self.baseline.thread.join(timeout=120)
            self.baseline.host.close()
        if self._deployment is not None:
            self._deployment.__exit__(None, None, None)


def run_pair(scenario: str, tool: str, bound: float) -> dict[str, Any]:
    """One (scenario, tool): the fault's start, the tool's first action, the server correct again."""
    with tempfile.TemporaryDirectory(prefix="sglsup-base-") as tmp:
        subject = Subject(tool, scenario, Path(tmp))
        try:
            return _measure(subject, scenario, bound)
        except (AssertionError, RuntimeError, OSError) as exc:
            return {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
        finally:
            subject.close()


def _measure(subject: Subject, scenario: str, bound: float) -> dict[str, Any]:
    launched = time.time()
    subject.start()
    scen = SCENARIOS.get(scenario)
    streams = scenario == "tool_markup_leak_under_load"
    zero = scenario == HEALTHY or (scen is not None and scen.zero_fault)
    if scenario == PARSER:
        t0, source = launched, "launch"
    else:
        if not wait_for(lambda: correct(subject.url)[0], 90, interval=1.0):
            return {"error": "never served correctly before the fault"}
        t0, source = _start_fault(subject, scenario, bound)
    if zero:
        time.sleep(max(0.0, t0 + bound - time.time()))  # a zero-fault window is observed to its end
        correct_at = None
    else:
        correct_at = _correct_again_at(subject, t0, bound, streams)
    acted = subject.actions_since(t0 - 1)
    launches = None
    with contextlib.suppress(OSError, ValueError, KeyError, AssertionError):
        launches = subject.launches()
    return {
        "fault_start_source": source,
        "detected": bool(acted),
        "detect_s": round(acted[0][0] - t0, 2) if acted else None,
        "correct_s": round(correct_at - t0, 2) if correct_at else None,
        "actions": [f"+{a[0] - t0:.1f}s {a[1]}" for a in acted[:6]],
        "n_actions": len(acted),
        "launches": launches,
        "relaunch_ok": (correct_at is not None) if launches and launches > 1 else None,
        "correct_at_end": True if correct_at else correct(subject.url, streams)[0],
        "bound_s": bound,
    }


def _start_fault(subject: Subject, scenario: str, bound: float) -> tuple[float, str]:
    """Start the fault and return its start time (wall) and where that came from."""
    if scenario == HEALTHY:
        return time.time(), "window_start"
    if scenario == ORPHANS:
        pid = subject.main_pid()
        t0 = time.time()
        if pid:
            os.kill(pid, signal.SIGKILL)  # stands in for the OOM killer or an operator's kill -9
        return t0, "sigkill_main"
    scen = SCENARIOS[scenario]
    armed = time.time()
    with FaultClock(subject.url, scenario) as clock:
        inject(subject.url, scenario)
        with Driver(subject.url, scen.traffic, bound, lambda: clock.seen is not None) as driver:
            wait_for(lambda: _started_or_gone(subject, clock, armed), 30, interval=0.1)
            start, source = clock.start(driver.first_at)
    return (start or time.time()), source


def _correct_again_at(subject: Subject, t0: float, bound: float, streams: bool) -> float | None:
    """When the server is correct again after the tool acted: checks start every `ORACLE_PERIOD_S`, side by side
    (one check takes ≥ 1 s: SGLang's `/health` generates a token), and the answer is the start of the earliest
    check that passed — a check that began before the new server listened fails at once, so the figure's
    resolution is the period, the same for every tool."""
    started: dict[concurrent.futures.Future[tuple[bool, str]], float] = {}
    passed: list[float] = []
    in_flight = 2 if streams else ORACLE_IN_FLIGHT  # a check with streams is 16 of them
    with concurrent.futures.ThreadPoolExecutor(max_workers=in_flight) as pool:
        while time.time() < t0 + bound and not passed:
            if not subject.actions_since(t0 - 1):
                time.sleep(ORACLE_PERIOD_S)
                continue
            for fut in [f for f in started if f.done()]:
                if fut.result()[0]:
                    passed.append(started[fut])
            if not passed and sum(not f.done() for f in started) < in_flight:
                at = time.time()
                started[pool.submit(correct, subject.url, streams)] = at
            time.sleep(ORACLE_PERIOD_S)
        if passed:  # a check that began earlier may still be running: wait for it to decide
            first = min(passed)
            for fut, at in started.items():
                if at < first and fut.result()[0]:
                    passed.append(at)
    return min(passed) if passed else None


def _started_or_gone(subject: Subject, clock: FaultClock, armed: float) -> bool:
    """The fault fired, or the tool already acted, or the server is gone (a crash fault: no state to read)."""
    if clock.seen is not None or subject.actions_since(armed):
        return True
    return http_status(subject.url + "/health", 3.0) is None


def _ratio(value: float | None, ref: float | None, bound: float) -> str:
    if ref is None or ref <= 0:
        return "-"
    if value is None:
        return f">{bound / ref:.0f}x"
    return f"{value / ref:.1f}x"


def print_table(report: dict[str, Any]) -> None:
    """One row per (scenario, tool), with ratios against sglang-supervisor."""
    head = f"{'scenario':38} {'tool':16} {'detect s':>9} {'correct s':>10} {'x detect':>9} {'x correct':>10}  first action"
    print(head)
    for scenario, rows in report["results"].items():
        ref = rows.get("supervisor", {})
        for tool, r in rows.items():
            bound = r.get("bound_s", report["bound_s"])
            if "error" in r:
                print(f"{scenario:38} {tool:16} error: {r['error']}")
                continue
            det = f"{r['detect_s']:.1f}" if r["detect_s"] is not None else f">{bound:.0f}"
            cor = f"{r['correct_s']:.1f}" if r["correct_s"] is not None else "never"
            rd = _ratio(r["detect_s"], ref.get("detect_s"), bound) if tool != "supervisor" else ""
            rc = _ratio(r["correct_s"], ref.get("correct_s"), bound) if tool != "supervisor" else ""
            first = r["actions"][0].split(" ", 1)[1][:60] if r["actions"] else "(no action)"
            print(f"{scenario:38} {tool:16} {det:>9} {cor:>10} {rd:>9} {rc:>10}  {first}")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Every scenario against every tool; the tools of one scenario run side by side."""
    args = build_parser().parse_args(argv)
    bound = args.bound or (45.0 if args.quick else 120.0)
    results: dict[str, dict[str, Any]] = {}
    for scenario in args.only or FAULTS:
        limit = bound if args.quick else max(bound, LONG_BOUND_S.get(scenario, bound))
        say(f"baselines: {scenario} ({limit:.0f} s bound)")
        tools = tools_for(scenario)
        with concurrent.futures.ThreadPoolExecutor(max_workers=len(tools)) as pool:
            futures = {t: pool.submit(run_pair, scenario, t, limit) for t in tools}
            results[scenario] = {t: f.result() for t, f in futures.items()}
    report = {"quick": args.quick, "bound_s": bound, "results": results}
    write_result("baselines", report)
    print_table(report)
    return report


def build_parser() -> argparse.ArgumentParser:
    """`--quick`, `--bound` and `--only`."""
    p = parser(__doc__)
    p.add_argument("--bound", type=float, default=None, help="seconds per (scenario, tool); 120, --quick 45")
    p.add_argument("--only", nargs="*", choices=FAULTS, help="run only these scenarios")
    return p


if __name__ == "__main__":
    main()
