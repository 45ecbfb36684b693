"""`python -m simulator.launch_router --pd-disaggregation --prefill URL [BOOTSTRAP_PORT] --decode URL --port P`.

A stand-in for `sglang_router.launch_router` in PD mode: each request gets `bootstrap_host`, `bootstrap_port` and
a random `bootstrap_room`, and is sent to a prefill and a decode worker concurrently; the decode's answer is
returned (streams are passed through). `/health` and `/liveness` are the router's own liveness; `/readiness`
needs a healthy prefill and a healthy decode.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

import aiohttp
from aiohttp import web

from simulator.logs import log

MAX_BODY = 32 * 1024 * 1024


@dataclass(frozen=True)
class Worker:
    """A prefill or decode worker URL (and the prefill's bootstrap port, None to let decode use its own)."""

    url: str
    bootstrap_port: int | None = None


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The router flags that matter here, with sglang_router's names and defaults."""
    p = argparse.ArgumentParser(prog="launch_router")
    p.add_argument("--pd-disaggregation", action="store_true")
    p.add_argument("--prefill", nargs="+", action="append", default=[], metavar=("URL", "BOOTSTRAP_PORT"))
    p.add_argument("--decode", nargs=1, action="append", default=[], metavar="URL")
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--policy", default="cache_aware")
    p.add_argument("--request-timeout-secs", type=int, default=1800)
    ns = p.parse_args(argv)
    if not ns.pd_disaggregation or not ns.prefill or not ns.decode:
        p.error("--pd-disaggregation with at least one --prefill and one --decode is required")
    return ns


def workers(ns: argparse.Namespace) -> tuple[list[Worker], list[Worker]]:
    """Prefill and decode workers from the parsed flags."""
    prefills = []
    for entry in ns.prefill:
        port = None
        if len(entry) > 1 and entry[1].lower() != "none":
            port = int(entry[1])
        prefills.append(Worker(entry[0].rstrip("/"), port))
    return prefills, [Worker(d[0].rstrip("/")) for d in ns.decode]


class Router:
    """Dual dispatch of each request to a prefill and a decode."""

    def __init__(self, prefills: list[Worker], decodes: list[Worker], timeout_s: int) -> None:
        self.prefills = prefills
        self.decodes = decodes
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.rng = random.Random()

    def app(self) -> web.Application:
        """Routes of the router."""
        app = web.Application(client_max_size=MAX_BODY)
        app.router.add_get("/health", self.alive)
        app.router.add_get("/liveness", self.alive)
        app.router.add_get("/readiness", self.readiness)
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/chat/completions", self.dispatch)
        app.router.add_post("/generate", self.dispatch)
        return app

    async def alive(self, request: web.Request) -> web.Response:
        """The router's own liveness."""
        return web.Response(text="OK")

    async def _healthy(self, session: aiohttp.ClientSession, url: str) -> bool:
        try:
            async with session.get(f"{url}/health", timeout=aiohttp.ClientTimeout(total=5)) as resp:
                return resp.status < 300
        except (TimeoutError, aiohttp.ClientError):
            return False

    async def readiness(self, request: web.Request) -> web.Response:
        """Ready with at least one healthy prefill and one healthy decode."""
        async with aiohttp.ClientSession() as session:
            p = [await self._healthy(session, w.url) for w in self.prefills]
            d = [await self._healthy(session, w.url) for w in self.decodes]
        if any(p) and any(d):
            return web.json_response(
                {"status": "ready", "healthy_workers": sum(p) + sum(d), "total_workers": len(p) + len(d)}
            )
        return web.json_response(
            {"status": "not ready", "reason": "insufficient healthy workers"}, status=503
        )

    async def models(self, request: web.Request) -> web.Response:
        """Proxied to a decode worker."""
        async with (
            aiohttp.ClientSession(timeout=self.timeout) as session,
            session.get(f"{self.decodes[0].url}/v1/models") as resp,
        ):
            return web.Response(body=await resp.read(), status=resp.status, content_type="application/json")

    async def dispatch(self, request: web.Request) -> web.StreamResponse:
        """Inject the bootstrap fields and send the request to both workers at once."""
        try:
            body: Any = json.loads(await request.read())
        except ValueError as exc:
            return web.json_response({"error": {"message": f"Invalid JSON: {exc}"}}, status=400)
        if not isinstance(body, dict):
            return web.json_response({"error": {"message": "a JSON object is expected"}}, status=400)
        prefill = self.rng.choice(self.prefills)
        decode = self.rng.choice(self.decodes)
        body.update(
            {
                "bootstrap_host": urlparse(prefill.url).hostname,
                "bootstrap_port": prefill.bootstrap_port,
                "bootstrap_room": self.rng.getrandbits(63),
            }
        )
        async with aiohttp.ClientSession(timeout=self.timeout) as session:
            prefill_task = asyncio.create_task(self._prefill(session, prefill.url + request.path, body))
            try:
                async with session.post(decode.url + request.path, json=body) as resp:
                    out = web.StreamResponse(
                        status=resp.status,
                        headers={"Content-Type": resp.headers.get("Content-Type", "application/json")},
                    )
                    await out.prepare(request)
                    async for chunk in resp.content.iter_any():
                        await out.write(chunk)
                    await out.write_eof()
                    return out
            except (TimeoutError, aiohttp.ClientError) as exc:
                return web.json_response({"error": {"message": f"decode worker failed: {exc!r}"}}, status=502)
            finally:
                prefill_task.cancel()

    async def _prefill(self, session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> None:
        pbody = dict(body, stream=False)
        try:
            async with session.post(url, json=pbody) as resp:
                await resp.read()
        except (TimeoutError, aiohttp.ClientError) as exc:
            log(f"prefill worker failed: {exc!r}")


async def serve(ns: argparse.Namespace) -> None:
    """Run the router until killed."""
    prefills, decodes = workers(ns)
    runner = web.AppRunner(Router(prefills, decodes, ns.request_timeout_secs).app(), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, ns.host, ns.port, reuse_address=True).start()
    log(
        f"Router listening on http://{ns.host}:{ns.port} (prefill: {[w.url for w in prefills]}, decode: {[w.url for w in decodes]})"
    )
    await asyncio.Event().wait()


def main(argv: list[str] | None = None) -> None:
    """Entry point."""
    ns = parse_args(sys.argv[1:] if argv is None else argv)
    asyncio.run(serve(ns))


if __name__ == "__main__":
    main()
