"""PD faults on the real pair and on the simulator, behind the real SMG in PD mode: figures, no asserts.

The real pair: SGLang 0.5.23's prefill and decode on CPU, the KV over Mooncake/TCP (`tests/real_pd/`, the real
tier's probe settings: `stall_after_s` 30). The simulated pair: `tests.support.daemon.PdDeployment` with the
product's default probes. Both under one daemon that drives SMG's membership (`[gateway]`), two clients through
SMG sending short chats in a loop. Per fault: seconds from the fault to the daemon's detection, to the right
server's relaunch (`server.started`), and to the pair serving again through SMG (the first chat answered 200
that was sent after that relaunch); which servers were relaunched; chats that failed through SMG.

Faults: `prefill_stop` (the prefill's scheduler SIGSTOPped), `decode_stop`, `prefill_kill` (its main SIGKILLed),
`both_kill`, `prefill_planned` (`restart --server prefill`: no detection), `oversized` (one chat whose prompt the
decode's KV pool cannot fit, real-pd.md §4b: the decode's requests aborted, nothing relaunched; "relaunch_s" is then
the abort's time).

Run: ``.venv/bin/python -m benchmarks.bench_pd [--worlds real sim]`` (real: ~10 min, sim: ~3 min).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil

from benchmarks.common import parser, say, write_result
from tests.gateway.support import ts
from tests.real_pd.support import Chats, real_pd_deployment
from tests.real_serving.support import tiny_models
from tests.support.daemon import PdDeployment, checked, q
from tests.support.gateways import ADMIN_KEY, Gateway, running_gateway
from tests.support.http import http
from tests.support.real_pd import real_pd_python
from tests.support.wait import wait_for

FAULTS = ("prefill_stop", "decode_stop", "prefill_kill", "both_kill", "prefill_planned", "oversized")
LONG_PROMPT = "weather Paris sunny servers GPUs story " * 150  # 3605 tokens on the real pair's tokenizer
WORLDS = ("real", "sim")
PAIR = ("prefill", "decode")


def _proven(s: dict[str, dict[str, Any]]) -> bool:
    return all(s[n]["state"] == "serving" and not s[n].get("unproven") for n in PAIR)


def _events(root: Path, name: str) -> list[dict[str, Any]]:
    out = []
    for line in (root / "daemon.log").read_text(errors="replace").splitlines():
        with contextlib.suppress(ValueError):
            event = json.loads(line)
            if event.get("event") == name:
                out.append(event)
    return out


def _scheduler(pid: int) -> psutil.Process:
    for child in psutil.Process(pid).children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if " ".join(child.cmdline()).startswith("sglang::scheduler"):
                return child
    raise RuntimeError(f"no sglang::scheduler under {pid}")


def _ready(dep: Any, gw: Gateway, urls: dict[str, str], timeout: float) -> dict[str, dict[str, Any]]:
    servers: dict[str, dict[str, Any]] = dep.wait_all(_proven, timeout, "pair proven")
    wait_for(lambda: all(u in gw.live() for u in urls.values()), 120, "both in SMG")
    return servers


def run_fault(
    dep: Any, gw: Gateway, urls: dict[str, str], model: str, fault: str, timeout: float
) -> dict[str, Any]:
    """Inject `fault` under load through SMG and time the recovery."""
    first = _ready(dep, gw, urls, timeout)
    with Chats(gw.url, model) as chats:
        wait_for(lambda: chats.ok() >= 2, 120, "chats through the pair")
        t0 = time.time()
        if fault.endswith("_stop"):
            _scheduler(first[fault.split("_")[0]]["pid"]).suspend()
        elif fault == "prefill_kill":
            os.kill(first["prefill"]["pid"], signal.SIGKILL)
        elif fault == "both_kill":
            for name in PAIR:
                os.kill(first[name]["pid"], signal.SIGKILL)
        elif fault == "oversized":
            _oversized(dep, gw, urls, model)
        else:
            dep.post("/control/restart", {"server": "prefill", "reason": "bench"}, token=dep.token)
        target = "decode" if fault in ("decode_stop", "oversized") else "prefill"
        if fault == "oversized":
            wait_for(lambda: _events(dep.root, "requests.aborted"), timeout, "the decode's abort")
            after = dep.wait_all(_proven, timeout, "pair proven")
        else:
            after = dep.wait_all(
                lambda s: s[target]["pid"] != first[target]["pid"] and _proven(s), timeout, fault
            )
        marks = "requests.aborted" if fault == "oversized" else "server.started"
        started = [ts(e) for e in _events(dep.root, marks) if e.get("server") == target and ts(e) >= t0 - 1]
        relaunched_at = min(started) if started else None
        wait_for(
            lambda: any(s >= (relaunched_at or t0) and code == 200 for s, _, code in chats.results),
            timeout,
            "ok again",
        )
    detected = [ts(e) for e in _events(dep.root, "fault.detected") if ts(e) >= t0 - 1]
    back = min(e for s, e, code in chats.results if s >= (relaunched_at or t0) and code == 200)
    return {
        "fault": fault,
        "detect_s": round(min(detected) - t0, 1) if detected else None,
        "relaunch_s": round(relaunched_at - t0, 1) if relaunched_at else None,
        "serving_again_s": round(back - t0, 1),
        "relaunched": sorted(n for n in PAIR if after[n]["pid"] != first[n]["pid"]),
        "failed": sum(1 for s, _, code in chats.results if code != 200 and s >= t0 - 1),
        "requests": sum(1 for s, _, _ in chats.results if s >= t0 - 1),
    }


def _oversized(dep: Any, gw: Gateway, urls: dict[str, str], model: str) -> None:
    """Send the chat the decode's pool cannot fit through SMG (in a thread: it hangs until aborted); arm the
    simulator's fault first where the decode is simulated."""
    if isinstance(dep, PdDeployment):
        fault = {
            "name": "pd_prompt_exceeds_decode_pool",
            "prompt_tokens_ge": 1000,
        }  # the sim counts 4 chars a token
        dep.post("/sim/fault", fault, base=urls["decode"])
    body = {"model": model, "messages": [{"role": "user", "content": LONG_PROMPT}], "max_tokens": 8}
    url = f"{gw.url}/v1/chat/completions"
    threading.Thread(target=lambda: _quietly(url, body), daemon=True).start()


def _quietly(url: str, body: dict[str, Any]) -> None:
    with contextlib.suppress(OSError):
        http(url, "POST", body, 600)


@contextlib.contextmanager
def world(name: str, root: Path) -> Iterator[tuple[Any, Gateway, dict[str, str], str, float]]:
    """A started pair behind SMG: (deployment, gateway, urls, model, timeout)."""
    if name == "real":
        python = real_pd_python()
        models = tiny_models(python)
        with real_pd_deployment(root, python, models) as dep:
            dep.start()
            assert dep.gateway is not None
            yield dep, dep.gateway, dep.urls, str(dep.model_dir), 900.0
        return
    (root / "gateway-key").write_text(ADMIN_KEY + "\n")
    with running_gateway("smg", root, extra=["--pd-disaggregation"]) as gw:
        lines = ["[gateway]", f"url = {q(gw.url)}", f"admin_key_file = {q(str(root / 'gateway-key'))}"]
        sim = PdDeployment(root, gateway_lines=lines, probes={"stream_canary_period_s": 0})
        with checked(sim):
            sim.start()
            urls = {
                "prefill": f"http://127.0.0.1:{sim.port}",
                "decode": f"http://127.0.0.1:{sim.decode_port}",
            }
            yield sim, gw, urls, sim.model, 180.0


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = parser(__doc__)
    p.add_argument("--worlds", nargs="+", choices=WORLDS, default=list(WORLDS))
    p.add_argument("--faults", nargs="+", choices=FAULTS, default=list(FAULTS))
    args = p.parse_args(argv)
    rows: dict[str, list[dict[str, Any]]] = {}
    for name in args.worlds:
        with (
            tempfile.TemporaryDirectory(prefix=f"sglsup-bench-pd-{name}-") as tmp,
            world(name, Path(tmp)) as w,
        ):
            for fault in args.faults:
                say(f"== {name} {fault}")
                rows.setdefault(name, []).append(run_fault(*w[:4], fault, w[4]))
    keys = ("detect_s", "relaunch_s", "serving_again_s", "relaunched", "failed", "requests")
    print(f"{'world':6} {'fault':16} " + " ".join(f"{k:>18}" for k in keys))
    for name, found in rows.items():
        for row in found:
            print(f"{name:6} {row['fault']:16} " + " ".join(f"{row[k]!s:>18}" for k in keys))
    write_result("pd", rows)
    return rows


if __name__ == "__main__":
    main()
