"""Prefill/decode disaggregation: the prefill's bootstrap server and the decode's wait for KV.

The router sends each request to both servers with `bootstrap_host/port/room`. The decode pre-allocates its KV in
order (its pre-allocation queue) and tells the prefill's bootstrap server (the handshake); the prefill holds the
request in its bootstrap queue until then, runs it and marks the room transferred; the decode parks the request in
its transfer queue until the room is transferred, then decodes. With `pd_prompt_exceeds_decode_pool` a prompt of
the trigger's size never pre-allocates and blocks every later request (real-pd.md §4b) until the client leaves or
`/abort_request` aborts all. A decode's heartbeat forgets a prefill whose bootstrap server missed two beats (5 s
apart), so a prefill replaced after that is found anew; one back sooner — or any, with the
`prefill_replaced_decode_stale` fault — leaves the decode waiting on the stale endpoints (failure H7, real-pd.md)
until it is restarted itself. A request without a bootstrap room is refused with SGLang's 400; one whose bootstrap endpoint the decode cannot
reach is aborted after 15 tries a second apart (SGLang's lines, a 500).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
import uuid
from typing import Any

import aiohttp
from aiohttp import web

from simulator.cli import SimServerArgs
from simulator.engine import Engine
from simulator.faults import FaultBook
from simulator.logs import log
from simulator.sim_metrics import SimMetrics

FAKE_BOOTSTRAP_HOST = "2.2.2.2"  # SGLang's warmup and health requests: no real KV transfer
POLL_S = 0.05
ENSURE_TRIES = 15  # SGLang's decode: tries to fetch a prefill's info, one scheduling pass a second apart


class PdSide:
    """The PD role of this server (a no-op for `--disaggregation-mode null`)."""

    def __init__(self, args: SimServerArgs, metrics: SimMetrics, engine: Engine, faults: FaultBook) -> None:
        self.mode = str(args.disaggregation_mode or "null")
        self.args = args
        self.metrics = metrics
        self.engine = engine
        self.faults = faults
        self.instance = uuid.uuid4().hex
        self.rooms: set[str] = set()
        self.worker_dead = False
        self.known_prefill: dict[str, str] = {}
        self.prefill_lost = False  # decode: the prefill it knows was replaced behind the same address
        self.waiting: dict[str, set[str]] = {}  # decode: rooms parked for KV, by prefill bootstrap address
        self.failed: set[str] = set()  # decode: parked rooms whose prefill was lost (they end with a 500)
        self.waiting_timeout = float(os.environ.get("SGLANG_DISAGGREGATION_WAITING_TIMEOUT", "300"))
        self.bootstrap_timeout = float(os.environ.get("SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT", "300"))
        self.bootstrapping: set[str] = set()  # prefill: rooms waiting for a decode to pre-allocate
        self.preallocated: set[str] = set()  # prefill: rooms a decode pre-allocated (its handshake came)
        self.abandoned: set[str] = set()  # prefill: rooms whose decode aborted them before pre-allocating
        self.prealloc: list[str] = []  # decode: rooms waiting to pre-allocate, in order
        self.reached: set[str] = set()  # decode: bootstrap addresses whose prefill info it fetched
        self.aborts = 0  # `/abort_request` abort_all calls: a parked request seeing it change ends aborted

    def abort_all(self) -> None:
        """`/abort_request {"abort_all": true}`: the requests parked in the PD queues end aborted too."""
        self.aborts += 1

    async def heartbeat(self) -> None:
        """Decode side, as SGLang's heartbeat checker: every `SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL` s ask each
        known prefill's bootstrap `/health`; after `…_HEARTBEAT_MAX_FAILURE` misses in a row forget it (its next
        request finds the prefill anew). `prefill_replaced_decode_stale` stops the checker: the endpoints stay."""
        interval = float(os.environ.get("SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL", "5"))
        limit = int(os.environ.get("SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE", "2"))
        misses: dict[str, int] = {}
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3)) as session:
            while True:
                await asyncio.sleep(interval)
                if self.faults.get("prefill_replaced_decode_stale"):
                    continue
                for addr in list(self.known_prefill):
                    try:
                        async with session.get(f"http://{addr}/health") as resp:
                            ok = resp.status == 200
                    except (TimeoutError, aiohttp.ClientError):
                        ok = False
                    if ok:
                        misses[addr] = 0
                        continue
                    log(f"Attempting to reconnect to {addr}...")
                    misses[addr] = misses.get(addr, 0) + 1
                    if misses[addr] >= limit:
                        misses.pop(addr)
                        self.known_prefill.pop(addr, None)
                        self.reached.discard(addr)
                        self.prefill_lost = False
                        affected = self.waiting.pop(addr, set())
                        self.failed |= affected
                        log(
                            f"Lost connection with prefill instance (bootstrap_addr: {addr}), "
                            f"{len(affected)} requests affected"
                        )

    def bootstrap_app(self) -> web.Application:
        """The prefill's KV bootstrap server."""
        app = web.Application()
        app.router.add_get("/health", self._bootstrap_health)
        app.router.add_get("/route", self._bootstrap_health)
        app.router.add_get("/sim/kv/{room}", self._kv)
        app.router.add_post("/sim/prealloc/{room}", self._handshake)
        app.router.add_post("/sim/abort/{room}", self._abandon)
        return app

    async def _handshake(self, request: web.Request) -> web.Response:
        self.preallocated.add(request.match_info["room"])
        return web.Response(text="OK")

    async def _abandon(self, request: web.Request) -> web.Response:
        """The decode aborted the room (SGLang's abort notification): the prefill fails it too."""
        self.abandoned.add(request.match_info["room"])
        return web.Response(text="OK")

    async def _bootstrap_health(self, request: web.Request) -> web.Response:
        return web.Response(text="OK")

    async def _kv(self, request: web.Request) -> web.Response:
        room = request.match_info["room"]
        if room in self.rooms:
            return web.json_response({"instance": self.instance, "room": room})
        return web.json_response({"instance": self.instance, "room": None}, status=404)

    def after_prefill(self, body: dict[str, Any]) -> None:
        """Prefill side: the request ran; hand its KV over unless the transfer worker is broken."""
        if self.mode != "prefill" or body.get("bootstrap_room") is None:
            return
        room = str(body["bootstrap_room"])
        if self.worker_dead:
            return
        if self.faults.check("nixl_transfer_worker_assert"):
            log(
                f"Unexpected transfer worker error for room {room}: Traceback (most recent call last):\n"
                '  File "/sgl-workspace/sglang/python/sglang/srt/disaggregation/nixl/conn.py", line 512, in transfer_worker\n'
                "    assert room in self.transfer_infos\nAssertionError"
            )
            fault = self.faults.get("nixl_transfer_worker_assert")
            self.worker_dead = bool(fault and fault.params.get("variant", "B") == "B")
            return
        self.rooms.add(room)
        self.metrics.kv_transferred(
            2.0, prompt_tokens=max(1, len(json.dumps(body.get("messages") or "")) // 4)
        )

    async def gate(
        self, body: dict[str, Any], openai: bool = True, prompt_tokens: int = 0
    ) -> web.Response | None:
        """Either side: SGLang's 400 for a request without a bootstrap room. Prefill side: wait in the bootstrap
        queue for the decode's handshake. Decode side: pre-allocate in order, then wait in the transfer queue for
        the request's KV; None when it may run."""
        if self.mode in ("prefill", "decode") and body.get("bootstrap_room") is None:
            message = (
                "Invalid request: Disaggregated request received without bootstrap room id. "
                f"req.rid='{uuid.uuid4().hex}'"
            )
            log(message)
            if openai:
                error = {"object": "error", "message": message, "type": "BadRequestError", "param": None}
                return web.json_response({**error, "code": 400}, status=400)
            return web.json_response({"error": {"message": message}}, status=400)
        host = str(body.get("bootstrap_host") or "127.0.0.1")
        if self.mode not in ("prefill", "decode") or host == FAKE_BOOTSTRAP_HOST:
            return None
        room = str(body["bootstrap_room"])
        if self.mode == "prefill":
            return await self._bootstrap(room)
        port = body.get("bootstrap_port") or self.args.disaggregation_bootstrap_port
        addr = f"{host}:{port}"
        aborts = self.aborts
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3)) as session:
            failed = await self._reach(session, addr, room)
            if failed is not None:
                return failed
            blocked = await self._preallocate(session, addr, room, prompt_tokens, aborts)
            return blocked if blocked is not None else await self._transfer(session, addr, room, aborts)

    async def _bootstrap(self, room: str) -> web.Response | None:
        """Prefill side: the bootstrap queue, until a decode pre-allocated the room (SGLang's bootstrap timeout)."""
        aborts, deadline = self.aborts, time.monotonic() + self.bootstrap_timeout
        self.bootstrapping.add(room)
        try:
            while room not in self.preallocated:
                if self.aborts != aborts:
                    return _aborted(room)
                if room in self.abandoned:
                    log(
                        f"Prefill bootstrap failed for request rank=0 req.rid='{uuid.uuid4().hex}' "
                        f"req.bootstrap_room={room} with exception KVTransferError(bootstrap_room={room})"
                    )
                    return _error(f"Prefill bootstrap failed for request rank=0 req.bootstrap_room={room}")
                if time.monotonic() > deadline:
                    message = f"Request {room} timed out after {self.bootstrap_timeout:.1f}s in KVPoll.Bootstrapping"
                    log(
                        f"Prefill bootstrap failed for request rank=0 with exception KVTransferError({message})"
                    )
                    return _error(f"KVTransferError(bootstrap_room={room}): {message}")
                await asyncio.sleep(POLL_S)
            return None
        finally:
            self.bootstrapping.discard(room)
            self.preallocated.discard(room)
            self.abandoned.discard(room)

    async def _reach(self, session: aiohttp.ClientSession, addr: str, room: str) -> web.Response | None:
        """Decode side: fetch the prefill's info from its bootstrap server (`/route`) once per address, as SGLang
        does before pre-allocating: ENSURE_TRIES tries 1 s apart, counted in the pre-allocation queue; then the
        request is aborted with SGLang's lines and a 500 (a bootstrap endpoint the decode cannot reach)."""
        if addr in self.reached:
            return None
        self.prealloc.append(room)
        self.engine.parked += 1
        try:
            for tries in range(1, ENSURE_TRIES + 1):
                try:
                    async with session.get(f"http://{addr}/route") as resp:
                        if resp.status == 200:
                            self.reached.add(addr)
                            return None
                        error = f"Failed to get prefill server info: {resp.status}"
                except (TimeoutError, aiohttp.ClientError) as exc:
                    error = f"Error fetching prefill server info from bootstrap: {exc!r}"
                log(error)
                if tries < ENSURE_TRIES:
                    await asyncio.sleep(1.0)
        finally:
            self.prealloc.remove(room)
            self.engine.parked -= 1
        log(f"Could not fetch prefill parallel info from {addr} after {ENSURE_TRIES} attempts")
        message = (
            f"Decode handshake failed for request rank=0 decode_req.req.rid='{uuid.uuid4().hex}' "
            f"decode_req.req.bootstrap_room={room} with exception KVTransferError(bootstrap_room={room}): "
            "Aborted by AbortReq."
        )
        log(message)
        return _error(message)

    async def _preallocate(
        self, session: aiohttp.ClientSession, addr: str, room: str, prompt_tokens: int, aborts: int
    ) -> web.Response | None:
        """Decode side: the pre-allocation queue, in order; a prompt too large for the pool never leaves it."""
        fault = self.faults.get("pd_prompt_exceeds_decode_pool")
        too_large = fault is not None and prompt_tokens >= int(fault.trigger.get("prompt_tokens_ge", 3000))
        self.prealloc.append(room)
        self.engine.parked += 1
        try:
            while too_large or self.prealloc[0] != room:
                if self.aborts != aborts:
                    log(
                        f"Decode handshake failed for request rank=0 decode_req.req.bootstrap_room={room} with "
                        f"exception KVTransferError(bootstrap_room={room}): Aborted by AbortReq."
                    )
                    with contextlib.suppress(TimeoutError, aiohttp.ClientError):
                        async with session.post(f"http://{addr}/sim/abort/{room}") as resp:
                            await resp.read()
                    return _aborted(room)
                await asyncio.sleep(POLL_S)
        finally:
            self.prealloc.remove(room)
            self.engine.parked -= 1
        with contextlib.suppress(TimeoutError, aiohttp.ClientError):
            async with session.post(f"http://{addr}/sim/prealloc/{room}") as resp:
                await resp.read()
        self.metrics.kv_transferred(2.0)
        return None

    async def _transfer(
        self, session: aiohttp.ClientSession, addr: str, room: str, aborts: int
    ) -> web.Response | None:
        """Decode side: the transfer queue, until the room's KV arrived (SGLang's waiting timeout)."""
        wedged = self.faults.check("pd_decode_transfer_wedge")
        self.engine.parked += 1  # live in /v1/loads; the gauges wait for the next batch's stats
        self.waiting.setdefault(addr, set()).add(room)
        try:
            deadline = time.monotonic() + self.waiting_timeout
            while time.monotonic() < deadline:
                if room in self.failed:
                    return _lost(room, addr)
                if self.aborts != aborts:
                    return _aborted(room)
                if not wedged and await self._kv_arrived(session, addr, room):
                    return None
                await asyncio.sleep(POLL_S)
            log(
                "Some requests fail to receive KV Cache transfer done signal after bootstrapping. If a greater mean "
                "TTFT is acceptable, you can 'export SGLANG_DISAGGREGATION_WAITING_TIMEOUT=600' (default: 300s)"
            )
            log(
                f"Decode transfer failed for request rank=0 decode_req.req.rid='{uuid.uuid4().hex}' "
                f"decode_req.req.bootstrap_room={room} with exception KVTransferError(bootstrap_room={room}): "
                f"Request {room} timed out after {self.waiting_timeout:.1f}s in KVPoll.WaitingForInput"
            )
            self.metrics.tokenizer.transfer_failed()
            return _error(
                f"KVTransferError(bootstrap_room={room}): Failed to get kvcache from prefill instance, it might be dead"
            )
        finally:
            self.engine.parked -= 1
            self.waiting.get(addr, set()).discard(room)
            self.failed.discard(room)

    async def _kv_arrived(self, session: aiohttp.ClientSession, addr: str, room: str) -> bool:
        try:
            async with session.get(f"http://{addr}/sim/kv/{room}") as resp:
                data = await resp.json(content_type=None)
        except (TimeoutError, aiohttp.ClientError, ValueError):
            return False
        instance = str(data.get("instance", "")) if isinstance(data, dict) else ""
        known = self.known_prefill.setdefault(addr, instance)
        if known != instance:
            if not self.prefill_lost:
                self.prefill_lost = True
                log(f"Could not fetch prefill parallel info from {addr}")
            return False
        return resp.status == 200


def _error(message: str) -> web.Response:
    """SGLang's 500 for a PD request that failed."""
    return web.json_response(
        {"object": "error", "message": message, "type": "500", "param": None, "code": 500}, status=500
    )


def _aborted(room: str) -> web.Response:
    """A request ended by `/abort_request` while parked in a PD queue."""
    return _error(f"KVTransferError(bootstrap_room={room}): Aborted by AbortReq.")


def _lost(room: str, addr: str) -> web.Response:
    """A parked request whose prefill the heartbeat dropped: SGLang fails it with a 500."""
    message = f"KVTransferError(bootstrap_room={room}): Lost connection with prefill instance (bootstrap_addr: {addr})"
    log(
        f"Decode transfer failed for request rank=0 decode_req.req.bootstrap_room={room} with exception {message}"
    )
    return _error(message)
