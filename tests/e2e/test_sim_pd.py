"""PD disaggregation: prefill + decode + the router stand-in, and the PD faults F3, F4, F5."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from tests.support.http import http
from tests.support.ports import free_port
from tests.support.sim import FAST_CRASH, Sim, cleanup, kill_group, start, wait_ready
from tests.support.wait import wait_for

CHAT = {"model": "Qwen/Qwen3-8B", "messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 16}
GAUGE = (
    'sglang:num_decode_transfer_queue_reqs{model_name="Qwen/Qwen3-8B",engine_type="decode",'
    'tp_rank="0",pp_rank="0",moe_ep_rank="0"}'
)
WAIT = {
    "SGLANG_DISAGGREGATION_WAITING_TIMEOUT": "3",
    "SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL": "1",
    **FAST_CRASH,
}


@dataclass
class Pd:
    """A prefill, a decode and a router sharing one state dir."""

    prefill: Sim
    decode: Sim
    router: Sim
    bootstrap: int

    def chat(self, timeout: float = 30) -> tuple[int, str]:
        """One chat completion through the router: status and body text."""
        reply = http(f"http://127.0.0.1:{self.router.port}/v1/chat/completions", "POST", CHAT, timeout)
        return reply.status, reply.body.decode()


def _prefill(tmp_path: Path, bootstrap: int, env: dict[str, str], port: int | None = None) -> Sim:
    args = ("--disaggregation-mode", "prefill", "--disaggregation-bootstrap-port", str(bootstrap))
    return start(tmp_path, *args, env=env, port=port, name="prefill", state_dir=tmp_path / "state")


def _decode(tmp_path: Path, env: dict[str, str], port: int | None = None) -> Sim:
    args = ("--disaggregation-mode", "decode", "--base-gpu-id", "1", "--enable-metrics")
    return start(tmp_path, *args, env=env, port=port, name="decode", state_dir=tmp_path / "state")


@contextlib.contextmanager
def pd_deployment(
    tmp_path: Path, prefill_env: dict[str, str] | None = None, decode_env: dict[str, str] | None = None
) -> Iterator[Pd]:
    """Start prefill, decode and router; tear all of them down after."""
    bootstrap, router_port = free_port(1), free_port(1)
    prefill = _prefill(tmp_path, bootstrap, {**WAIT, **(prefill_env or {})})
    decode = _decode(tmp_path, {**WAIT, **(decode_env or {})})
    argv = ["--pd-disaggregation", "--prefill", prefill.base_url, str(bootstrap), "--decode", decode.base_url]
    router = start(
        tmp_path,
        *argv,
        "--port",
        str(router_port),
        port=router_port,
        name="router",
        module="simulator.launch_router",
    )
    pd = Pd(prefill, decode, router, bootstrap)
    try:
        wait_ready(prefill)
        wait_ready(decode)
        wait_for(lambda: router.get("/liveness").status == 200, 20, "router up")
        yield pd
    finally:
        for sim in (pd.router, pd.decode, pd.prefill):
            cleanup(sim)


def test_chat_through_the_router_succeeds(tmp_path: Path) -> None:
    """A chat request sent to the router is prefilled, transferred and decoded; the router is ready."""
    with pd_deployment(tmp_path) as pd:
        status, body = pd.chat()
        assert status == 200 and '"choices"' in body
        assert pd.router.get("/readiness").json()["status"] == "ready"
        assert http(f"http://127.0.0.1:{pd.bootstrap}/health").body == b"OK"
        pd.prefill.wait_log("Prefill batch")


def transfer_queue(sim: Sim) -> int:
    """The decode's live transfer queue, as `GET /v1/loads` shows it."""
    return int(sim.get("/v1/loads").json()["loads"][0]["disaggregation"]["decode_transfer_queue_reqs"])


def test_f3_decode_transfer_wedge_is_invisible_to_health(tmp_path: Path) -> None:
    """F3 on decode: requests park in the transfer queue (live in /v1/loads; the gauge stale at 0 as on the real
    decode, real-pd.md §4a; /health 200), then 500 KVTransferError."""
    scenario = {"SGLANG_SIM_SCENARIO": "pd_decode_transfer_wedge"}
    with ThreadPoolExecutor(1) as pool, pd_deployment(tmp_path, decode_env=scenario) as pd:
        reply = pool.submit(pd.chat)
        wait_for(lambda: transfer_queue(pd.decode) >= 1, 10, "the request in the transfer queue")
        assert pd.decode.metrics().get(GAUGE, 0) == 0
        assert pd.decode.get("/health").status == 200
        assert pd.prefill.get("/health").status == 200
        status, body = reply.result(timeout=30)
        assert status == 500 and "KVTransferError(bootstrap_room=" in body
        assert "Failed to get kvcache from prefill instance, it might be dead" in body
        pd.decode.wait_log(
            r"Decode transfer failed for request rank=0 .*after 3\.0s in KVPoll\.WaitingForInput"
        )
        assert transfer_queue(pd.decode) == 0


def test_f4_nixl_transfer_worker_assert_hangs_later_requests(tmp_path: Path) -> None:
    """F4 on prefill: the transfer worker dies with an AssertionError; every PD request then fails, health 200."""
    with pd_deployment(tmp_path, prefill_env={"SGLANG_SIM_SCENARIO": "nixl_transfer_worker_assert"}) as pd:
        assert pd.chat()[0] == 500
        pd.prefill.wait_log(r"Unexpected transfer worker error for room \d+")
        assert "AssertionError" in pd.prefill.log()
        assert pd.chat()[0] == 500
        assert pd.prefill.get("/health").status == 200 and pd.decode.get("/health").status == 200


def test_a_prefill_replaced_after_the_heartbeat_dropped_it_is_found_anew(tmp_path: Path) -> None:
    """As on the real pair: the decode's heartbeat forgets a prefill whose bootstrap server missed two beats, and
    finds the one relaunched after that behind the same address — no decode restart."""
    with pd_deployment(tmp_path) as pd:
        assert pd.chat()[0] == 200
        kill_group(pd.prefill)
        pd.decode.wait_log(
            f"Lost connection with prefill instance \\(bootstrap_addr: 127.0.0.1:{pd.bootstrap}\\)"
        )
        pd.prefill = _prefill(tmp_path, pd.bootstrap, WAIT, port=pd.prefill.port)
        wait_ready(pd.prefill)
        assert pd.chat()[0] == 200


def test_a_prefill_back_within_the_heartbeat_leaves_the_decode_stale(tmp_path: Path) -> None:
    """As on the real pair (a planned prefill restart with a short drain): a prefill back before the decode
    missed two beats is never bootstrapped; the decode's requests wait for KV and fail (500)."""
    slow = {"SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL": "30"}
    with pd_deployment(tmp_path, decode_env=slow) as pd:
        assert pd.chat()[0] == 200
        kill_group(pd.prefill)
        pd.prefill = _prefill(tmp_path, pd.bootstrap, WAIT, port=pd.prefill.port)
        wait_ready(pd.prefill)
        assert pd.chat()[0] == 500
        pd.decode.wait_log(f"Could not fetch prefill parallel info from 127.0.0.1:{pd.bootstrap}")


def test_f5_prefill_restart_wedges_decode_until_decode_restarts(tmp_path: Path) -> None:
    """F5: after a prefill restart decode keeps the stale instance (requests 500, health 503) until restarted."""
    decode_env = {"SGLANG_SIM_SCENARIO": "prefill_replaced_decode_stale"}
    with pd_deployment(tmp_path, decode_env=decode_env) as pd:
        assert pd.chat()[0] == 200
        kill_group(pd.prefill)
        pd.prefill = _prefill(tmp_path, pd.bootstrap, WAIT, port=pd.prefill.port)
        wait_ready(pd.prefill)
        assert pd.prefill.get("/health").status == 200  # the prefill alone is fine
        refused = pd.prefill.post("/v1/chat/completions", CHAT)  # a request without a room, as SGLang does
        assert refused.status == 400 and b"without bootstrap room id" in refused.body
        assert pd.chat()[0] == 500
        pd.decode.wait_log(f"Could not fetch prefill parallel info from 127.0.0.1:{pd.bootstrap}")
        assert pd.decode.get("/health").status == 503
        kill_group(pd.decode)
        pd.decode = _decode(tmp_path, {**WAIT, **decode_env}, port=pd.decode.port)
        wait_ready(pd.decode)
        assert pd.chat()[0] == 200


def pd_queues(sim: Sim) -> dict[str, int]:
    """A PD worker's live queues (`GET /v1/loads`)."""
    return dict(sim.get("/v1/loads").json()["loads"][0]["disaggregation"])


LONG_CHAT = {
    **CHAT,
    "messages": [{"role": "user", "content": "weather Paris sunny servers GPUs story " * 400}],
}


def test_a_prompt_too_large_for_the_decodes_pool_blocks_it_until_aborted(tmp_path: Path) -> None:
    """real-pd.md §4b: the oversized prompt never leaves the decode's pre-allocation queue and every later request
    queues behind it (the prefill holds each in its bootstrap queue), /health 200 on the prefill and 503 on the
    decode (its health request queues too, as the real decode's did in the fidelity diff); `/abort_request`
    abort_all ends them (500 `Aborted by AbortReq.`) and the next request is served."""
    scenario = {"SGLANG_SIM_SCENARIO": "pd_prompt_exceeds_decode_pool"}
    router = "/v1/chat/completions"
    with ThreadPoolExecutor(2) as pool, pd_deployment(tmp_path, decode_env=scenario) as pd:
        url = f"http://127.0.0.1:{pd.router.port}{router}"
        blocked = pool.submit(http, url, "POST", LONG_CHAT, 60)
        wait_for(
            lambda: pd_queues(pd.decode)["decode_prealloc_queue_reqs"] == 1, 10, "the long prompt parked"
        )
        behind = pool.submit(pd.chat)
        wait_for(lambda: pd_queues(pd.decode)["decode_prealloc_queue_reqs"] == 2, 10, "a request behind it")
        assert pd_queues(pd.prefill)["prefill_bootstrap_queue_reqs"] == 2
        assert pd_queues(pd.decode)["decode_transfer_queue_reqs"] == 0
        assert pd.prefill.get("/health").status == 200
        # the decode's own health request waits behind the blocked queue: 503 after SGLang's 20 s health timeout
        assert pd.decode.get("/health", timeout=40).status == 503
        assert http(f"{pd.decode.base_url}/abort_request", "POST", {"abort_all": True}).status == 200
        reply = blocked.result(timeout=30)
        assert reply.status == 500 and b"Aborted by AbortReq." in reply.body
        assert behind.result(timeout=30)[0] == 500
        pd.decode.wait_log(r"Decode handshake failed for request .*Aborted by AbortReq\.")
        assert pd.chat()[0] == 200
        assert pd_queues(pd.decode)["decode_prealloc_queue_reqs"] == 0
