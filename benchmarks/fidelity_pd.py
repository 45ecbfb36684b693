"""Fidelity diff of the PD pair: the same observation sequence against the real prefill and decode (SGLang 0.5.23
on CPU, KV over Mooncake/TCP) and the simulated pair, then the differences (the PD section of the fidelity
diff; `benchmarks/fidelity_diff.py` covers one server).

Recorded per world: a chat without a bootstrap room to each side (status, normalised message); the same chat to
both with a room (statuses, whether the decode's answer carries the tool call); the keys of the decode's
`/v1/loads` `disaggregation`; then, with the prefill's scheduler SIGSTOPped and a chat through the pair in flight:
the decode's live queue (`/v1/loads`), its `num_decode_transfer_queue_reqs` gauge and `/health`, the prefill's
`/health` and its bootstrap server's; then the prefill's whole tree SIGKILLed: whether the decode logs `Lost
connection with prefill instance` within 30 s and what the parked request got. Figures, no verdict.

    .venv/bin/python -m benchmarks.fidelity_pd [--sim-only]

Everything listens on 127.0.0.1; every process is killed at the end.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks.common import RESULTS
from benchmarks.fidelity_diff import Target, _gauge, _http, diff_profiles
from tests.real_pd.support import COMMON, DECODE_CPU, MOONCAKE_ENV, PREFILL_CPU
from tests.real_serving.support import SCRIPTED, tiny_models
from tests.support.ports import free_port
from tests.support.real_pd import library_path, real_pd_python

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
CHAT = {
    "model": "m",
    "messages": [{"role": "user", "content": "weather in Paris?"}],
    "max_tokens": 24,
    "tools": TOOLS,
}
_RID = re.compile(r"req\.rid='[0-9a-f]+'")


def _pair_chat(
    prefill: Target, decode: Target, boot: int, timeout: float
) -> tuple[int | None, int | None, str]:
    """The same chat to both with a fresh room: (prefill status, decode status, decode body)."""
    body = {
        **CHAT,
        "bootstrap_host": "127.0.0.1",
        "bootstrap_port": boot,
        "bootstrap_room": random.getrandbits(63),
    }
    out: dict[str, tuple[int | None, float, str]] = {}

    def send(name: str, url: str) -> None:
        out[name] = _http("POST", url + "/v1/chat/completions", body, timeout)

    threads = [threading.Thread(target=send, args=(n, t.url)) for n, t in (("p", prefill), ("d", decode))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return out["p"][0], out["d"][0], out["d"][2]


def _loads_queue(decode: Target) -> float:
    _, _, text = _http("GET", decode.url + "/v1/loads", None, 30)
    pd = json.loads(text)["loads"][0]["disaggregation"]
    return float(pd["decode_prealloc_queue_reqs"] + pd["decode_transfer_queue_reqs"])


def observe(prefill: Target, decode: Target, boot: int) -> dict[str, Any]:
    """The whole sequence on one pair; leaves it killed."""
    try:
        profile: dict[str, Any] = {"ready": {"prefill": prefill.wait_ready(), "decode": decode.wait_ready()}}
        for name, target in (("prefill", prefill), ("decode", decode)):
            code, _, text = _http("POST", target.url + "/v1/chat/completions", CHAT, 60)
            profile[f"no_room_{name}"] = [code, _RID.sub("req.rid='…'", text)[:160] if text else ""]
        p, d, text = _pair_chat(prefill, decode, boot, 120)
        profile["pair"] = {"prefill": p, "decode": d, "tool_call": '"get_weather"' in text}
        _, _, loads = _http("GET", decode.url + "/v1/loads", None, 30)
        profile["loads_disaggregation_keys"] = sorted(json.loads(loads)["loads"][0]["disaggregation"])
        prefill.rank("sglang::scheduler").suspend()
        parked: dict[str, Any] = {}
        thread = threading.Thread(target=lambda: parked.update(r=_pair_chat(prefill, decode, boot, 120)))
        thread.start()
        time.sleep(8)
        health, health_s, _ = _http("GET", decode.url + "/health", None, 30)
        profile["stopped_prefill"] = {
            "decode_live_queue": _loads_queue(decode),
            "decode_transfer_gauge": _gauge(decode.url, "sglang:num_decode_transfer_queue_reqs"),
            "decode_health": health,
            "decode_health_under_5s": health_s < 5,
            "prefill_health": _http("GET", prefill.url + "/health", None, 5)[0],
            "bootstrap_health": _http("GET", f"http://127.0.0.1:{boot}/health", None, 5)[0],
        }
        mark = len(decode.log_lines())
        prefill.kill()
        deadline = time.monotonic() + 30
        lost = False
        while time.monotonic() < deadline and not lost:
            lost = any("Lost connection with prefill instance" in x for x in decode.log_lines()[mark:])
            time.sleep(0.5)
        thread.join(timeout=60)
        result = parked.get("r")
        profile["prefill_killed"] = {
            "decode_logs_lost_connection": lost,
            "parked_decode_status": result and result[1],
        }
        return profile
    finally:
        prefill.kill()
        decode.kill()


def _pair(kind: str, python: str, model: Path, work: Path) -> tuple[Target, Target, int]:
    boot = free_port()
    common = [
        "-m",
        "simulator.launch_server" if kind == "sim" else "sglang.launch_server",
        "--model-path",
        str(model),
    ]
    common += (
        ["--host", "127.0.0.1", *COMMON] if kind == "real" else ["--host", "127.0.0.1", "--enable-metrics"]
    )
    env: dict[str, str] = {"SGLANG_SIM_STATE_DIR": str(work / "sim"), "SGLANG_SIM_SHM_DIR": str(work / "shm")}
    if kind == "real":
        rpc = free_port(100)
        env = {
            **MOONCAKE_ENV,
            "LD_LIBRARY_PATH": library_path(),
            "MC_MIN_RPC_PORT": str(rpc),
            "MC_MAX_RPC_PORT": str(rpc + 99),
        }
    pport, dport = free_port(3), free_port(3)
    p_args = [
        "--port",
        str(pport),
        "--disaggregation-mode",
        "prefill",
        "--disaggregation-bootstrap-port",
        str(boot),
    ]
    p_args += PREFILL_CPU if kind == "real" else []
    d_args = ["--port", str(dport), "--disaggregation-mode", "decode"]
    d_args += DECODE_CPU if kind == "real" else ["--disaggregation-bootstrap-port", str(boot)]
    if kind == "real":
        p_args += ["--nccl-port", str(free_port())]
        d_args += ["--nccl-port", str(free_port())]
    p_env = {**env, "SGLANG_DISAGGREGATION_ALL_CP_RANKS_TRANSFER": "1"}
    prefill = Target(f"{kind}-prefill", [python, *common, *p_args], p_env, pport, work)
    decode = Target(f"{kind}-decode", [python, *common, *d_args], env, dport, work)
    return prefill, decode, boot


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sim-only", action="store_true", help="profile the simulated pair only")
    args = parser.parse_args()
    python = real_pd_python()
    model = tiny_models(python) / SCRIPTED
    profiles: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="sglsup-fidelity-pd-") as tmp:
        for kind in ("sim",) if args.sim_only else ("sim", "real"):
            work = Path(tmp) / kind
            work.mkdir()
            profiles[kind] = observe(
                *_pair(kind, sys.executable if kind == "sim" else str(python), model, work)
            )
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "fidelity_pd.json").write_text(json.dumps(profiles, indent=1))
    if "real" not in profiles:
        print(json.dumps(profiles["sim"], indent=1))
        return
    for line in diff_profiles(profiles["real"], profiles["sim"]):
        print("  " + line)


if __name__ == "__main__":
    main()
