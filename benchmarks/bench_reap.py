"""Process mechanics figures: main exit → noticed, and SIGKILL of a 9-process tree → devices verified free.

Run: ``.venv/bin/python -m benchmarks.bench_reap [--exits 20] [--reaps 5] [--interval 0.25]``.
The exit watcher polls like the daemon does (``poll_tree`` every ``--interval`` seconds); the kill lands at
a random phase of that loop. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

from supervisor.host import gpu, launcher, proctree, reaper

TREE = Path(__file__).resolve().parent.parent / "tests" / "process" / "fixtures" / "tree.py"
READY_TIMEOUT_S = 30.0


def _start(work: Path, flags: list[str]) -> tuple[launcher.Launched, str, dict[str, object]]:
    run_id = f"bench-{uuid.uuid4().hex[:12]}"
    ready = work / f"{run_id}.json"
    argv = [sys.executable, str(TREE), "--ready", str(ready), *flags]
    handle = launcher.spawn(argv, {}, [0], run_id, "bench", work / f"{run_id}.log")
    if not isinstance(handle, launcher.Launched):
        raise SystemExit(handle.reason)
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not ready.exists():
        if time.monotonic() > deadline or handle.returncode() is not None:
            raise SystemExit(f"fixture tree did not start: {handle.tail(20)}")
        time.sleep(0.01)
    info: dict[str, object] = json.loads(ready.read_text())
    return handle, run_id, info


def _finish(handle: launcher.Launched, run_id: str) -> None:
    result = reaper.stop(handle.pid, handle.pgid, run_id, "kill", 0, 10)
    if not result.ok:
        raise SystemExit(result.reason)
    deadline = time.monotonic() + 10
    while handle.returncode() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    handle.close()


def exit_latency(work: Path, interval_s: float) -> float:
    """Seconds from SIGKILL of main to the poll loop reporting main_exited."""
    handle, run_id, _ = _start(work, ["--ranks", "2"])
    killed_at: list[float] = []

    def kill() -> None:
        killed_at.append(time.monotonic())
        os.kill(handle.pid, signal.SIGKILL)

    timer = threading.Timer(random.uniform(0.3, 0.3 + interval_s), kill)
    previous, _ = proctree.poll_tree(None, handle.pid, run_id)
    timer.start()
    deadline = time.monotonic() + 10
    noticed = None
    while noticed is None and time.monotonic() < deadline:
        time.sleep(interval_s)
        previous, events = proctree.poll_tree(previous, handle.pid, run_id)
        if any(e.kind == "main_exited" for e in events):
            noticed = time.monotonic()
    timer.join()
    _finish(handle, run_id)
    if noticed is None:
        raise SystemExit("main exit not noticed within 10 s")
    return noticed - killed_at[0]


def reap_time(work: Path) -> tuple[float, float, int]:
    """Seconds for stop(kill) and for stop + verify_free on a main + 7 ranks + detokenizer tree."""
    devs = []
    for i in range(8):
        dev = work / "dev" / f"nvidia{i}"
        dev.parent.mkdir(exist_ok=True)
        dev.write_bytes(b"stand-in GPU\n")
        devs.append(dev)
    holds = [arg for dev in devs for arg in ("--hold", str(dev))]
    handle, run_id, _ = _start(work, ["--ranks", "7", "--detokenizer", *holds])
    known = [*proctree.descendants(handle.pid)]
    start = time.monotonic()
    stopped = reaper.stop(handle.pid, handle.pgid, run_id, "kill", 0, 10, device_paths=devs, known=known)
    stop_s = time.monotonic() - start
    verified = gpu.verify_free(list(range(8)), devs, gpu.NoneBackend(), 1.0, deadline_s=10)
    total_s = time.monotonic() - start
    if not (stopped.ok and verified.ok):
        raise SystemExit(f"{stopped.reason}; {verified.reason}")
    _finish(handle, run_id)
    return stop_s, total_s, len(stopped.killed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--exits", type=int, default=20)
    parser.add_argument("--reaps", type=int, default=5)
    parser.add_argument("--interval", type=float, default=0.25)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-reap-") as tmp:
        work = Path(tmp)
        exits = [exit_latency(work, args.interval) for _ in range(args.exits)]
        reaps = [reap_time(work) for _ in range(args.reaps)]
    report = {
        "poll_interval_s": args.interval,
        "exit_noticed_median_s": round(statistics.median(exits), 4),
        "exit_noticed_max_s": round(max(exits), 4),
        "exit_samples": len(exits),
        "tree_processes_killed": reaps[0][2],
        "sigkill_tree_median_s": round(statistics.median(r[0] for r in reaps), 4),
        "sigkill_to_verified_free_median_s": round(statistics.median(r[1] for r in reaps), 4),
        "reap_samples": len(reaps),
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
