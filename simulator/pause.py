"""SGLang 0.5.23's engine pause and its neighbours, as reinforcement-learning clients call them.

`POST /pause_generation` (`{"mode": "abort" | "retract" | "in_place"}`, default `abort`) sets the tokenizer's pause:
every new request (health checks included) waits before the scheduler until `POST /continue_generation`.
`abort` ends the requests in flight; `retract` and `in_place` keep them and pause the scheduler's loop
(`simulator.engine.Engine.pause`). `GET /ready` is 503 while paused or not healthy, `GET /ping` 503 only when not
healthy (a `/health` that fails during a pause marks the server unhealthy). `/release_memory_occupation`,
`/resume_memory_occupation` and `/update_weights_from_disk` answer as SGLang does on a server without the memory
saver (docs/contracts.md, "Engine pause").
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

from aiohttp import web

from simulator.dp import DpEngines
from simulator.errors import error
from simulator.logs import log

MODES = ("abort", "retract", "in_place")


class PauseGate:
    """The tokenizer's pause flag and the handlers that set and read it."""

    def __init__(self, engine: DpEngines, healthy: Callable[[], bool]) -> None:
        self.engine = engine
        self.healthy = healthy
        self.open = asyncio.Event()
        self.open.set()

    @property
    def paused(self) -> bool:
        """True between a `/pause_generation` and the next `/continue_generation`."""
        return not self.open.is_set()

    def routes(self, router: web.UrlDispatcher) -> None:
        """Add the pause, memory and weight-update endpoints and `/ready`, `/ping`."""
        router.add_get("/ready", self.ready)
        router.add_get("/ping", self.ping)
        router.add_post("/pause_generation", self.pause_generation)
        router.add_post("/continue_generation", self.continue_generation)
        for path in ("/release_memory_occupation", "/resume_memory_occupation"):
            router.add_route("GET", path, self.memory_occupation)
            router.add_route("POST", path, self.memory_occupation)
        router.add_post("/update_weights_from_disk", self.update_weights_from_disk)

    async def wait_open(self) -> None:
        """Where a new request waits while generation is paused (before the scheduler sees it)."""
        await self.open.wait()

    async def ready(self, request: web.Request) -> web.Response:
        """200 when not paused and healthy, else 503."""
        return web.Response(status=200 if not self.paused and self.healthy() else 503)

    async def ping(self, request: web.Request) -> web.Response:
        """SageMaker's health: 200 when healthy, paused or not."""
        return web.Response(status=200 if self.healthy() else 503)

    async def pause_generation(self, request: web.Request) -> web.Response:
        """Pause in the body's mode (default `abort`)."""
        body = await _body(request)
        if isinstance(body, web.Response):
            return body
        mode = body.get("mode", "abort")
        if mode not in MODES:
            return web.json_response(
                {
                    "detail": [
                        {"type": "literal_error", "loc": ["body", "mode"], "msg": f"Input should be {MODES}"}
                    ]
                },
                status=422,
            )
        self.open.clear()
        await asyncio.to_thread(self.engine.pause, mode)
        return web.json_response({"message": "Generation paused successfully.", "status": "ok"})

    async def continue_generation(self, request: web.Request) -> web.Response:
        """End the pause: waiting requests go on, the scheduler steps again."""
        body = await _body(request)
        if isinstance(body, web.Response):
            return body
        await asyncio.to_thread(self.engine.resume)
        self.open.set()
        return web.json_response({"message": "Generation continued successfully.", "status": "ok"})

    async def memory_occupation(self, request: web.Request) -> web.Response:
        """Release or resume the memory saver's regions: a no-op without `--enable-memory-saver`; body `null`."""
        return web.json_response(None)

    async def update_weights_from_disk(self, request: web.Request) -> web.Response:
        """Reload the (simulated) weights in place."""
        body = await _body(request)
        if isinstance(body, web.Response):
            return body
        log("Start update_weights. Load format=auto")
        log("Update weights end.")
        return web.json_response(
            {"success": True, "message": "Succeeded to update model weights.", "num_paused_requests": 0}
        )


async def _body(request: web.Request) -> dict[str, Any] | web.Response:
    """The JSON object of a control call (an empty body is `{}`), or the 400 SGLang answers to invalid JSON."""
    raw = await request.read()
    if not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        return error(400, f"Invalid JSON body: {exc}")
    return body if isinstance(body, dict) else error(400, "a JSON object is expected")
