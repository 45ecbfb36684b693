"""The daemon's own cost: CPU, RSS and loop lag while it supervises serving simulated servers.

Two hosts: one tp-8 server, and eight tp-1 servers (a host of eight single-GPU servers) in one daemon. Once every
server serves and has run its first load canary (`stream_canary_first_s` after serving; the canaries run
every 5 and 30 minutes after that, outside these windows), the daemon process is sampled every second for the window (CPU % of one core, RSS), untouched;
then, for a second window, `/healthz` of its status server is fetched every 100 ms: the status server runs on
the daemon's event loop, so the fetch's latency above its floor is the loop's lag (p50, p99, max). The fetches
cost the daemon CPU themselves, which is why the CPU window comes first and without them.

Run: ``.venv/bin/python -m benchmarks.bench_footprint [--quick]``.
"""

from __future__ import annotations

import json
import os
import statistics
import threading
import time
import urllib.request
from typing import Any

import psutil

from benchmarks.common import bench_deployment, parser, say, summary, write_result
from tests.support.daemon import Deployment
from tests.support.ports import free_port

HEALTHZ_PERIOD_S = 0.1


def eight_servers(dep: Deployment) -> None:
    """Rewrite `dep`'s config as eight tp-1 servers, one per stand-in GPU, each on its own ports."""
    text = dep.config_path.read_text()
    head, server = text.split("[[servers]]", 1)
    blocks = []
    for gpu in range(8):
        port = free_port(3)
        block = server.replace(f'"{dep.port}"', f'"{port}"').replace(f"[{dep.port + 2}]", f"[{port + 2}]")
        block = block.replace('name = "sim"', f'name = "sim{gpu}"')
        block = block.replace('"--tp-size", "8"', '"--tp-size", "1"')
        block = block.replace("gpus = [0, 1, 2, 3, 4, 5, 6, 7]", f"gpus = [{gpu}]")
        devices = [str(d) for d in dep.devices]
        block = block.replace(json.dumps(devices), json.dumps([devices[gpu]]))
        blocks.append("[[servers]]" + block)
    dep.config_path.write_text(head + "".join(blocks))


def _settled(dep: Deployment) -> bool:
    """Every server serves and has run its first load canary (the steady state, between canaries)."""
    try:
        with urllib.request.urlopen(dep.url + "/status", timeout=5) as resp:
            servers = json.loads(resp.read())["servers"]
    except (OSError, ValueError, KeyError):
        return False
    return bool(servers) and all(
        s.get("state") == "serving" and "canary_stream" in s["probes"]["probes"] for s in servers
    )


def _lag(url: str, stop: threading.Event, out: list[float]) -> None:
    while not stop.is_set():
        t0 = time.monotonic()
        try:
            with urllib.request.urlopen(url + "/healthz", timeout=10) as resp:
                resp.read()
        except OSError:
            continue
        out.append(time.monotonic() - t0)
        stop.wait(HEALTHZ_PERIOD_S)


def measure(servers: int, window_s: float) -> dict[str, Any]:
    """Serve, then sample the daemon for `window_s`."""
    with bench_deployment(tp=8) as dep:
        if servers == 8:
            eight_servers(dep)
        daemon = dep.start()
        deadline = time.monotonic() + 240
        while not _settled(dep):
            if time.monotonic() > deadline or daemon.poll() is not None:
                return {"error": f"not every server served: {dep.log_tail(5)}"}
            time.sleep(0.5)
        proc = psutil.Process(daemon.pid)
        proc.cpu_percent(None)
        cpu: list[float] = []
        rss: list[float] = []
        t0 = time.monotonic()
        while time.monotonic() - t0 < window_s:
            time.sleep(1.0)  # the sampling period
            cpu.append(proc.cpu_percent(None))
            rss.append(proc.memory_info().rss / 2**20)
        lags: list[float] = []
        stop = threading.Event()
        poller = threading.Thread(target=_lag, args=(dep.url, stop, lags), daemon=True)
        poller.start()
        time.sleep(window_s)  # the lag window itself
        stop.set()
        poller.join(timeout=15)
        states = [
            s["state"] for s in json.loads(urllib.request.urlopen(dep.url + "/status").read())["servers"]
        ]
    floor = min(lags) if lags else 0.0
    excess = sorted(x - floor for x in lags)
    return {
        "servers": servers,
        "window_s": window_s,
        "states": states,
        "cpu_percent": {"mean": round(statistics.fmean(cpu), 2), "max": round(max(cpu), 1)},
        "rss_mib": {"median": round(statistics.median(rss), 1), "max": round(max(rss), 1)},
        "loop_lag_s": {
            **summary(excess),
            "p99": round(excess[int(0.99 * (len(excess) - 1))], 4) if excess else None,
            "floor_s": round(floor, 4),
        },
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """One tp-8 server, then eight tp-1 servers."""
    args = parser(__doc__).parse_args(argv)
    window = 20.0 if args.quick else 60.0
    report: dict[str, Any] = {"quick": args.quick, "load_before": os.getloadavg()}
    for name, servers in (("tp8", 1), ("eight_tp1", 8)):
        say(f"footprint: {name} ({window:.0f} s)")
        report[name] = measure(servers, window)
    report["load_after"] = os.getloadavg()
    write_result("footprint", report)
    print_report(report)
    return report


def print_report(report: dict[str, Any]) -> None:
    """One line per host, then the load average around the run."""
    for name in ("tp8", "eight_tp1"):
        r = report.get(name, {})
        if "error" in r:
            print(f"{name:10} error: {r['error']}")
            continue
        if r:
            lag = r["loop_lag_s"]
            print(
                f"{name:10} CPU {r['cpu_percent']['mean']} % mean (max {r['cpu_percent']['max']}), "
                f"RSS {r['rss_mib']['median']} MiB (max {r['rss_mib']['max']}), "
                f"loop lag p50 {lag.get('median')} s p99 {lag.get('p99')} s max {lag.get('max')} s"
            )
    print(f"load average before {report.get('load_before')}, after {report.get('load_after')}")


if __name__ == "__main__":
    main()
