"""False restarts: zero-fault episodes that must end with no incident, with and without a saturated CPU.

Episodes (default probe settings, a simulated Kimi-K2.5 server, tp 2):

- `long_prefill`: the simulator's `health_false_negative_long_prefill` (a long prefill: `/health` 503 while the
  engine computes) with sequential chats;
- `busy_64`: a busy healthy server, 64 concurrent tool-call streams in back-to-back rounds;
- each again `+ cpu_saturated`: `2 × cores + 2` busy-looping processes (more runnable processes than cores) for
  the whole window, each one ending by itself at the window's end.

Per episode: incidents (any kind) from the traffic's start to the window's end, restarts, the state at the end.
Every wait is bounded; every process started here is killed at the end.

Run: ``.venv/bin/python -m benchmarks.bench_false [--quick]``.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

from benchmarks.common import (
    Driver,
    bench_deployment,
    burst,
    incidents_since,
    inject,
    parser,
    say,
    serving,
    write_result,
)

LONG_PREFILL = "health_false_negative_long_prefill"
EPISODES = ("long_prefill", "busy_64")
BURNER = (
    "import time, sys\nend = time.monotonic() + float(sys.argv[1])\nwhile time.monotonic() < end:\n    pass\n"
)


@contextlib.contextmanager
def saturated(seconds: float, on: bool = True) -> Iterator[int]:
    """`2 × cores + 2` busy loops for at most `seconds` (none when `on` is false); yields their count."""
    n = 2 * (os.cpu_count() or 1) + 2 if on else 0
    procs = [subprocess.Popen([sys.executable, "-c", BURNER, str(seconds)]) for _ in range(n)]
    try:
        yield n
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(timeout=10)


def _rounds(url: str, n: int, stop: threading.Event, counts: list[int]) -> None:
    while not stop.is_set():
        burst(url, n)
        counts.append(n)


def episode(kind: str, cpu_saturated: bool, window_s: float) -> dict[str, Any]:
    """One zero-fault episode: serve, start the load (and the saturation), observe the window."""
    with bench_deployment() as dep:
        dep.start()
        first = dep.wait(serving, timeout=180, what="serving")
        t0 = time.time()
        streams: list[int] = []
        with saturated(window_s + 5, cpu_saturated) as burners:
            if kind == "long_prefill":
                inject(dep.sim_url, LONG_PREFILL)
                with Driver(dep.sim_url, "requests", max_s=window_s + 10):
                    time.sleep(window_s)  # the observation window itself, not a synchronisation
            else:
                stop = threading.Event()
                thread = threading.Thread(target=_rounds, args=(dep.sim_url, 64, stop, streams), daemon=True)
                thread.start()
                time.sleep(window_s)  # the observation window itself
                stop.set()
                thread.join(timeout=120)
            load = os.getloadavg()[0]
        now = dep.server()
        found = incidents_since(dep, t0)
    return {
        "episode": kind + (" + cpu_saturated" if cpu_saturated else ""),
        "window_s": window_s,
        "busy_processes": burners,
        "load_1m_at_end": round(load, 1),
        "streams_sent": sum(streams),
        "incidents": len(found),
        "incident_faults": [f"{i['fault']}: {str(i.get('reason', ''))[:120]}" for i in found[:5]],
        "restarts": int(now["restarts"]) - int(first["restarts"]),
        "state_after": now["state"],
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Every episode, without and with a saturated CPU."""
    args = parser(__doc__).parse_args(argv)
    window = 45.0 if args.quick else 90.0
    runs = []
    for kind in EPISODES:
        for hot in (False, True):
            say(f"false restarts: {kind}{' + cpu_saturated' if hot else ''} ({window:.0f} s)")
            try:
                runs.append(episode(kind, hot, window))
            except (AssertionError, OSError) as exc:
                runs.append({"episode": kind, "error": f"{type(exc).__name__}: {str(exc)[:200]}"})
    report = {"quick": args.quick, "runs": runs}
    write_result("false_restarts", report)
    print_report(report)
    return report


def print_report(report: dict[str, Any]) -> None:
    """One line per episode."""
    for r in report["runs"]:
        if "error" in r:
            print(f"{r['episode']:32} error: {r['error']}")
            continue
        print(
            f"{r['episode']:32} incidents {r['incidents']} restarts {r['restarts']} state {r['state_after']:9} "
            f"load {r['load_1m_at_end']:5} busy procs {r['busy_processes']:2} {'; '.join(r['incident_faults'])}"
        )


if __name__ == "__main__":
    main()
