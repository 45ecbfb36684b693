"""A wedge behind SGLang's gateway, four ways side by side: figures, no asserts.

The real SMG 1.13.0 (round robin) in front of two simulated servers under one daemon (`a` tp 2, `b` tp 1;
`stall_after_s = 4`), clients through the gateway at 8 requests a second whatever the answers (open loop, every
other one streaming, 60 s timeout like real clients).
`a` runs into a TP desync (`overlap_tp_desync_hang`: `/health` stays 200 on its busy path); the supervisor
detects it, kills `a` and relaunches it with `--disable-overlap-schedule`. What changes is how the gateway learns:

- `smg-defaults`: the workers given to SMG at start (`--worker-urls`), its own health checks (60 s, 3 failures);
- `smg-tuned`: the same with `--health-check-interval-secs 1 --health-failure-threshold 1
  --health-success-threshold 1 --health-check-timeout-secs 3`;
- `haproxy-readiness`: each worker given to SMG as a HAProxy frontend gated on `/servers/<name>/ready` (checks
  every 500 ms, `fall 1 rise 1`), SMG tuned as above (the runbook's earlier recipe);
- `supervisor`: `[gateway]`: the supervisor adds and removes the workers itself.

Per configuration: failed client requests (and of them, those sent after the supervisor's detection), the
seconds from the detection to the last request the gateway sent to `a`'s old tree (out of rotation; the wedged
tree, then its dead port until it is relaunched), and from the relaunch's proof (`serving`) to the first request
the gateway sent it (back in rotation; negative: before it was proven), from SMG's own per-worker counter
(`smg_worker_requests_total`, sampled every 0.1 s).

Run: ``.venv/bin/python -m benchmarks.bench_gateway [--runs 3] [--configs supervisor smg-tuned]`` (about a minute
a run).
"""

from __future__ import annotations

import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import parser, say, write_result
from benchmarks.common import wait_for as bench_wait
from tests.gateway.support import Clients, Dispatches, GatewayDeployment, ts
from tests.support.daemon import checked
from tests.support.gateways import Gateway
from tests.support.http import http
from tests.support.ports import free_port
from tests.support.tools import ensure_haproxy
from tests.support.wait import wait_for

CONFIGS = ("smg-defaults", "smg-tuned", "haproxy-readiness", "supervisor")
TUNED = [
    "--health-check-interval-secs",
    "1",
    "--health-failure-threshold",
    "1",
    "--health-success-threshold",
    "1",
]
TUNED += ["--health-check-timeout-secs", "3"]
AFTER_S = 15.0  # traffic kept up after the relaunch is proven


def _haproxy(dep: GatewayDeployment, root: Path) -> tuple[subprocess.Popen[bytes], dict[str, str]]:
    """One HAProxy frontend per server, gated on the supervisor's readiness; returns the process and the fronts."""
    fronts = {name: f"http://127.0.0.1:{free_port()}" for name in dep.names}
    lines = [
        "defaults",
        "  mode http",
        "  timeout connect 1s",
        "  timeout client 90s",
        "  timeout server 90s",
    ]
    lines += ["  timeout check 3s"]
    for name in dep.names:
        lines += [
            f"listen {name}-gated",
            f"  bind {fronts[name].removeprefix('http://')}",
            f"  option httpchk GET /servers/{name}/ready",
            "  http-check expect status 200",
            f"  server {name} 127.0.0.1:{dep.ports[name]} check port {dep.http_port} inter 500 fall 1 rise 1",
        ]
    config = root / "haproxy.cfg"
    config.write_text("\n".join(lines) + "\n")
    binary, env = ensure_haproxy()
    proc = subprocess.Popen(
        [str(binary), "-f", str(config), "-db"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    return proc, fronts


def run_one(config: str, root: Path) -> dict[str, Any]:
    """One wedge under one configuration."""
    supervised = config == "supervisor"
    probes = {"stall_after_s": 4, "stream_canary_period_s": 0}
    gateway = Gateway(
        "smg", root / "smg.log", extra=TUNED if config in ("smg-tuned", "haproxy-readiness") else []
    )
    dep = GatewayDeployment(
        root, gateway_url=gateway.url, a_tp=2, probes=probes, env={"SGLANG_SIM_STEP_S": "0.02"},
        drives_gateway=supervised,
    )  # fmt: skip
    haproxy: subprocess.Popen[bytes] | None = None
    with checked(dep):
        if supervised:  # the supervisor fills the empty gateway itself
            gateway.start()
        dep.start()
        dep.wait_all(lambda s: all(x["state"] == "serving" for x in s.values()), 120, "both serving")
        if config == "haproxy-readiness":
            haproxy, fronts = _haproxy(dep, root)
            gateway.extra += ["--worker-urls", *fronts.values()]
        elif not supervised:
            gateway.extra += ["--worker-urls", *(dep.url_of(n) for n in dep.names)]
        try:
            if not supervised:
                gateway.start()
            wait_for(lambda: len(gateway.live()) == 2, 60, "both workers in the gateway", interval=0.2)
            old = dep.named("a")["pid"]
            dispatches = Dispatches(gateway)
            with Clients(gateway.url, rate=8.0) as clients:
                clients.wait_ok(20)
                fault_at = time.time()
                wedge = {"name": "overlap_tp_desync_hang", "after_requests": 1}
                http(dep.url_of("a") + "/sim/fault", "POST", wedge)
                again = dep.wait_all(
                    lambda s: s["a"]["state"] == "serving" and s["a"]["pid"] != old, 180, "a relaunched"
                )
                proven = again["a"]["since"]
                killed = max(ts(e) for e in dep.events("recovery.release") if e.get("server") == "a")
                bench_wait(lambda: dispatches.between(dep.url_of("a"), killed, time.time()), 90, interval=0.2)
                time.sleep(AFTER_S)
            dispatches.close()
        finally:
            gateway.stop()
            if haproxy is not None:
                haproxy.kill()
                haproxy.wait(timeout=10)
    detected = float(again["a"]["last_incident"]["detected_at"])
    back = [seen for _, seen in dispatches.between(dep.url_of("a"), killed, time.time())]
    failed = clients.failed()
    to_old = [seen for _, seen in dispatches.between(dep.url_of("a"), detected, killed)]
    return {
        "requests": len(clients.results),
        "failed": len(failed),
        "failed_sent_after_detection": len([r for r in failed if r[0] > detected]),
        "detection_s": round(detected - fault_at, 2),
        "out_of_rotation_after_detection_s": round(max(to_old) - detected, 2) if to_old else 0.0,
        "sent_to_old_after_detection": len(to_old),
        "back_after_proof_s": round(min(back) - proven, 2) if back else None,  # None: not within 90 s
        "added_latency_p50_s": round(
            statistics.median([r[1] - r[0] for r in clients.results if r[2] == "ok"]), 3
        ),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run each configuration `--runs` times; print one row per configuration (medians)."""
    p = parser(__doc__)
    p.add_argument("--runs", type=int, default=1)
    p.add_argument("--configs", nargs="+", choices=CONFIGS, default=list(CONFIGS))
    args = p.parse_args(argv)
    runs: dict[str, list[dict[str, Any]]] = {}
    for config in args.configs:
        for i in range(args.runs):
            say(f"== {config} run {i + 1}")
            with tempfile.TemporaryDirectory(prefix="sglsup-bench-gw-") as tmp:
                runs.setdefault(config, []).append(run_one(config, Path(tmp)))
    keys = (
        "failed",
        "failed_sent_after_detection",
        "sent_to_old_after_detection",
        "detection_s",
        "out_of_rotation_after_detection_s",
        "back_after_proof_s",
        "added_latency_p50_s",
    )
    print(f"{'config':20} " + " ".join(f"{k:>22}" for k in ("requests", *keys)))
    for config, rows in runs.items():
        cells = []
        for key in ("requests", *keys):
            values = [r[key] for r in rows if r[key] is not None]
            cells.append(f"{statistics.median(values) if values else '-':>22}")
        print(f"{config:20} " + " ".join(cells))
    write_result("gateway", runs)
    return runs


if __name__ == "__main__":
    main()
