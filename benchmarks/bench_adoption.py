"""The supervisor's own restart, measured: what clients of a simulated server lose, and how long the server is
without a supervisor, for each way the daemon restarts — against a reap-and-relaunch of the same server.

The simulated server loads in `--load-s` seconds (a real Kimi-K2.5 or DeepSeek takes 10-25 minutes: the
reap-and-relaunch row scales with it, the adoption rows do not). A client sends a chat request every 0.1 s
throughout; for each event:

- `client downtime`: from the first request that failed to the first that succeeded after it (0 when none failed);
- `supervision gap`: from the event until `/status` (of the new daemon) shows the server `serving` again.

Events: SIGKILL of the daemon (the next daemon adopts), `sglang-supervisor handover` (re-exec in place), a config
change that needs a relaunch (an added flag: adoption refused, reaped, relaunched) — the last is what every
restart of the daemon cost before adoption.

Run: ``.venv/bin/python -m benchmarks.bench_adoption [--quick] [--load-s 20]``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from functools import partial
from typing import Any

from benchmarks.common import bench_deployment, parser, say, serving, summary, wait_for, write_result
from tests.support.daemon import ROOT, Deployment


class Client:
    """One request every `period_s`; remembers when each failed or succeeded (bounded, stops on exit)."""

    def __init__(self, dep: Deployment, period_s: float = 0.1, max_requests: int = 20000) -> None:
        self.url, self.model = dep.sim_url + "/v1/chat/completions", dep.model
        self.period_s, self.max_requests = period_s, max_requests
        self.results: list[tuple[float, bool]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        body = json.dumps(
            {"model": self.model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        )
        while not self.stop.is_set() and len(self.results) < self.max_requests:
            req = urllib.request.Request(self.url, body.encode(), {"Content-Type": "application/json"})
            try:
                urllib.request.urlopen(req, timeout=2).read()
                ok = True
            except (OSError, ValueError):
                ok = False
            self.results.append((time.monotonic(), ok))
            self.stop.wait(self.period_s)

    def downtime_after(self, t0: float) -> float:
        """Seconds from the first failure after `t0` to the next success (0 when nothing failed)."""
        after = [(t, ok) for t, ok in self.results if t >= t0]
        first_fail = next((t for t, ok in after if not ok), None)
        if first_fail is None:
            return 0.0
        back = next((t for t, ok in after if ok and t > first_fail), None)
        return (back if back is not None else after[-1][0]) - first_fail

    def __enter__(self) -> Client:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=10)


def _kill_daemon(dep: Deployment) -> None:
    assert dep.daemon is not None
    os.killpg(dep.daemon.pid, signal.SIGKILL)
    dep.daemon.wait(timeout=10)
    dep.start()


def _handover(dep: Deployment) -> None:
    subprocess.run(
        [sys.executable, "-m", "supervisor.cli", "handover", "--url", dep.url, "--timeout", "120"],
        cwd=ROOT, capture_output=True, timeout=150, check=False,
    )  # fmt: skip


def _config_change(dep: Deployment) -> None:
    assert dep.daemon is not None
    os.killpg(dep.daemon.pid, signal.SIGKILL)
    dep.daemon.wait(timeout=10)
    dep.extra_args = [] if dep.extra_args else ["--disable-cuda-graph"]
    dep.write()
    dep.start()


EVENTS = {"daemon SIGKILL (adopted)": _kill_daemon, "handover (adopted)": _handover}
EVENTS["config change (reaped, relaunched)"] = _config_change


def run(samples: int, load_s: float) -> dict[str, Any]:
    """Each event `samples` times on one deployment; the figures per event."""
    report: dict[str, Any] = {}
    with bench_deployment(env={"SGLANG_SIM_STARTUP_S": str(load_s)}) as dep:
        dep.start()
        dep.wait(serving, timeout=120 + load_s, what="serving")
        with Client(dep) as client:
            for name, event in EVENTS.items():
                gaps, downs = [], []
                for i in range(samples):
                    say(f"adoption: {name} {i + 1}/{samples}")
                    before = dep.status()["started_at"]
                    t0 = time.monotonic()
                    event(dep)
                    back = wait_for(
                        partial(_serving_under_new_daemon, dep, before), 120 + 2 * load_s, interval=0.05
                    )
                    if back is None:
                        break
                    gaps.append(time.monotonic() - t0)
                    time.sleep(1.0)  # the client's next successes land before the figure is read
                    downs.append(client.downtime_after(t0))
                report[name] = {"supervision_gap_s": summary(gaps), "client_downtime_s": summary(downs)}
    return {"load_s": load_s, "events": report}


def _serving_under_new_daemon(dep: Deployment, before: float) -> bool | None:
    try:
        status = dep.status()
    except OSError:
        return None
    return True if status.get("started_at") != before and serving(status["servers"][0]) else None


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run every event and print one line each."""
    p = parser(__doc__)
    p.add_argument("--load-s", type=float, default=20.0, help="the simulated model load, seconds")
    args = p.parse_args(argv)
    report = run(2 if args.quick else 5, args.load_s)
    write_result("adoption", report)
    for name, figures in report["events"].items():
        gap, down = figures["supervision_gap_s"], figures["client_downtime_s"]
        print(
            f"{name:36} supervision gap median {gap['median']} s (max {gap['max']}), "
            f"client downtime median {down['median']} s (max {down['max']}), n={gap['n']}"
        )
    return report


if __name__ == "__main__":
    main()
