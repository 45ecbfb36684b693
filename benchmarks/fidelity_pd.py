"""The PD section of the fidelity diff (`benchmarks/fidelity_diff.py --sections pd`): the same observation sequence
against the real prefill and decode (SGLang 0.5.23 on CPU, KV over Mooncake/TCP) and the simulated pair.

Recorded per world: a chat without a bootstrap room to each side (status, normalised message); the same chat to
both with a room (statuses, whether the decode's answer carries the tool call); the keys of the decode's
`/v1/loads` `disaggregation` and the PD metrics of each side (names and label sets); then a prompt the decode's KV
pool cannot fit, sent through the pair (the simulated decode arms `pd_prompt_exceeds_decode_pool`, the real one has
a 3,625-token pool): each side's live queues, `/health`, what `POST /abort_request {"abort_all": true}` answers and
what the parked request got, whether the next chat is served; then, with the prefill's scheduler SIGSTOPped and a
chat through the pair in flight: the decode's live queue (`/v1/loads`), its `num_decode_transfer_queue_reqs` gauge
and `/health`, the prefill's `/health` and its bootstrap server's; then the prefill's whole tree SIGKILLed: whether
the decode logs `Lost connection with prefill instance` within 30 s and what the parked request got.

Everything listens on 127.0.0.1; every process is killed at the end.
"""

from __future__ import annotations

import json
import random
import re
import sys
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks.fidelity_target import Target, gauge, http_call, metric_shapes, normalise, worlds
from tests.real_pd.support import COMMON, DECODE_CPU, LONG_PROMPT, MOONCAKE_ENV, PREFILL_CPU
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
# The simulator counts a prompt's characters / 4 as its tokens (a real model's tokenizer, about), the real tier's
# tiny model ~2.5 times as many: the same fault needs a longer prompt there (the fault fires at 3,000 tokens).
SIM_LONG_PROMPT = LONG_PROMPT * 3
_RID = re.compile(r"req\.rid='[0-9a-f]+'")


def _send_pair(prefill: Target, decode: Target, boot: int, body: dict[str, Any], timeout: float) -> _Halves:
    """The same chat to both with a fresh room, as SGLang's router sends it; the answers arrive in the result."""
    room = {"bootstrap_host": "127.0.0.1", "bootstrap_port": boot, "bootstrap_room": random.getrandbits(63)}
    halves = _Halves()
    for name, target in (("p", prefill), ("d", decode)):
        url = target.url + "/v1/chat/completions"
        thread = threading.Thread(
            target=halves.send, args=(name, url, {**body, **room}, timeout), daemon=True
        )
        thread.start()
        halves.threads[name] = thread
    return halves


class _Halves:
    """A chat's two halves in flight: each side's (status, seconds, body) once answered."""

    def __init__(self) -> None:
        self.threads: dict[str, threading.Thread] = {}
        self.answers: dict[str, tuple[int | None, float, str]] = {}

    def send(self, name: str, url: str, body: dict[str, Any], timeout: float) -> None:
        self.answers[name] = http_call("POST", url, body, timeout)

    def result(self, name: str, wait_s: float) -> tuple[int | None, float, str] | None:
        """That side's answer, waiting at most `wait_s` (None: still unanswered)."""
        self.threads[name].join(timeout=wait_s)
        return self.answers.get(name)


def _pair_chat(
    prefill: Target, decode: Target, boot: int, timeout: float
) -> tuple[int | None, int | None, str]:
    """The tool chat to both with a fresh room: (prefill status, decode status, decode body)."""
    halves = _send_pair(prefill, decode, boot, CHAT, timeout)
    p, d = halves.result("p", timeout + 5), halves.result("d", timeout + 5)
    return p and p[0], d and d[0], d[2] if d else ""


def _queues(target: Target) -> dict[str, float]:
    """The PD queues of a server's `/v1/loads` (summed over its ranks)."""
    _, _, text = http_call("GET", target.url + "/v1/loads", None, 30)
    out: dict[str, float] = {}
    for rank in json.loads(text)["loads"] if text else []:
        for key, value in (rank.get("disaggregation") or {}).items():
            if key.endswith("_reqs"):
                out[key] = out.get(key, 0.0) + float(value)
    return out


def _loads_queue(decode: Target) -> float:
    queues = _queues(decode)
    return queues.get("decode_prealloc_queue_reqs", 0.0) + queues.get("decode_transfer_queue_reqs", 0.0)


def _pd_metrics(target: Target) -> dict[str, list[str]]:
    """The PD metrics of a server: name → label names (queues, transfers, bootstrap)."""
    shapes = metric_shapes(http_call("GET", target.url + "/metrics", None, 30)[2])
    words = ("transfer", "prealloc", "bootstrap", "disagg", "kv_")
    return {name: labels for name, labels in shapes.items() if any(w in name for w in words)}


def _unreachable_bootstrap(prefill: Target, decode: Target) -> dict[str, Any]:
    """A chat whose bootstrap port no prefill listens on (a router naming the wrong port): what the decode answers,
    how soon, what it logs; what the prefill's half gets; whether the next chat is served."""
    mark = len(decode.log_lines())
    halves = _send_pair(prefill, decode, free_port(), CHAT, 60)
    answer = halves.result("d", 65)
    prefill_half = halves.result("p", 5)
    said = [
        normalise(x) for x in decode.log_lines()[mark:] if "prefill" in x.lower() or "bootstrap" in x.lower()
    ]
    return {
        "decode": answer and [answer[0], round(answer[1] / 5) * 5, normalise(_RID.sub("", answer[2]))],
        "prefill_half": prefill_half and prefill_half[0],
        "decode_log": sorted(set(said))[:5],
    }


def _timed_health(target: Target) -> list[Any]:
    """`/health`'s status and seconds to the nearest 5 (SGLang answers within its own 20 s health timeout)."""
    code, took, _ = http_call("GET", target.url + "/health", None, 40)
    return [code, round(took / 5) * 5]


def _long_prompt(prefill: Target, decode: Target, boot: int) -> dict[str, Any]:
    """A prompt the decode's pool cannot fit, through the pair: the queues while it blocks, then abort_all."""
    prompt = LONG_PROMPT if prefill.kind.startswith("real") else SIM_LONG_PROMPT
    body = {**CHAT, "messages": [{"role": "user", "content": prompt}], "max_tokens": 8}
    halves = _send_pair(prefill, decode, boot, body, 120)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and _queues(decode).get("decode_prealloc_queue_reqs", 0) < 1:
        time.sleep(0.5)
    time.sleep(3)  # long enough for a pre-allocation that could happen to happen
    seen: dict[str, Any] = {
        "decode_queues": _queues(decode),
        "prefill_queues": _queues(prefill),
        "decode_health": _timed_health(decode),
        "prefill_health": _timed_health(prefill),
    }
    seen["abort"] = http_call("POST", decode.url + "/abort_request", {"abort_all": True}, 30)[0]
    parked = halves.result("d", 60)
    seen["parked_decode"] = parked and [parked[0], "Aborted by AbortReq." in parked[2]]
    answered = halves.result("p", 30)
    seen["parked_prefill"] = answered and answered[0]
    seen["next_chat"] = list(_pair_chat(prefill, decode, boot, 120)[:2])
    return seen


def observe(prefill: Target, decode: Target, boot: int) -> dict[str, Any]:
    """The whole sequence on one pair; leaves it killed."""
    try:
        profile: dict[str, Any] = {"ready": {"prefill": prefill.wait_ready(), "decode": decode.wait_ready()}}
        for name, target in (("prefill", prefill), ("decode", decode)):
            code, _, text = http_call("POST", target.url + "/v1/chat/completions", CHAT, 60)
            profile[f"no_room_{name}"] = [code, _RID.sub("req.rid='…'", text)[:160] if text else ""]
        p, d, text = _pair_chat(prefill, decode, boot, 120)
        profile["pair"] = {"prefill": p, "decode": d, "tool_call": '"get_weather"' in text}
        _, _, loads = http_call("GET", decode.url + "/v1/loads", None, 30)
        profile["loads_disaggregation_keys"] = sorted(json.loads(loads)["loads"][0]["disaggregation"])
        profile["pd_metrics"] = {"prefill": _pd_metrics(prefill), "decode": _pd_metrics(decode)}
        profile["long_prompt"] = _long_prompt(prefill, decode, boot)
        profile["unreachable_bootstrap"] = _unreachable_bootstrap(prefill, decode)
        profile["after_unreachable"] = list(_pair_chat(prefill, decode, boot, 120)[:2])
        prefill.rank("sglang::scheduler").suspend()
        parked: dict[str, Any] = {}
        thread = threading.Thread(target=lambda: parked.update(r=_pair_chat(prefill, decode, boot, 120)))
        thread.start()
        time.sleep(8)
        health, health_s, _ = http_call("GET", decode.url + "/health", None, 30)
        profile["stopped_prefill"] = {
            "decode_live_queue": _loads_queue(decode),
            "decode_transfer_gauge": gauge(decode.url, "sglang:num_decode_transfer_queue_reqs"),
            "decode_health": health,
            "decode_health_under_5s": health_s < 5,
            "prefill_health": http_call("GET", prefill.url + "/health", None, 5)[0],
            "bootstrap_health": http_call("GET", f"http://127.0.0.1:{boot}/health", None, 5)[0],
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
    d_env = {**env, "SGLANG_SIM_SCENARIO": "pd_prompt_exceeds_decode_pool"} if kind == "sim" else env
    decode = Target(f"{kind}-decode", [python, *common, *d_args], d_env, dport, work)
    return prefill, decode, boot


def profiles(sim_only: bool, work: Path) -> dict[str, Any]:
    """The PD profile of each world (the simulated pair, then the real one unless `sim_only`), under `work`."""
    python = real_pd_python()
    model = tiny_models(python) / SCRIPTED
    out: dict[str, Any] = {}
    for kind, where in worlds(sim_only, work, "pd"):
        out[kind] = observe(*_pair(kind, sys.executable if kind == "sim" else str(python), model, where))
    return out
