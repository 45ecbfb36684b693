"""A loopback server that misbehaves on purpose, in one of several modes, on every SGLang endpoint.

In-process (`HostileServer`, for probe-level tests) or as a process launched by the daemon in place of
SGLang (`python -m tests.hardening.hostile --port P ...`, mode from `HOSTILE_MODE`; other SGLang flags are
ignored). As a process it also starts two children titled like SGLang's tp-1 ranks, so the daemon sees a
normal tree and only the HTTP side lies.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import signal
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Handler

MiB = 1024 * 1024
HUGE_BYTES = 300 * MiB
MODES = (
    "invalid_json",
    "error_body",
    "huge_body",
    "drip",
    "wrong_content_type",
    "broken_sse",
    "metrics_million",
    "metrics_malformed",
    "metrics_truncated",
    "silent",
    "slow_valid",
)
ROTATION = tuple(m for m in MODES if m != "slow_valid")  # mode "rotate": the next of these on every request
SLOW_S = 2.0  # slow_valid: every answer this late (well inside the probes' timeouts)


def tool_call(city: str) -> dict[str, str]:
    """`get_weather(city)` as an OpenAI function object."""
    return {"name": "get_weather", "arguments": json.dumps({"city": city})}


def asked_city(body: dict[str, Any]) -> str:
    """The city of the canary's question (`What is the weather in CITY right now?`)."""
    text = str((body.get("messages") or [{}])[-1].get("content", ""))
    return text.removeprefix("What is the weather in ").split(" right now")[0] or "Paris"


def completion(city: str) -> dict[str, Any]:
    """A correct non-stream tool-call completion for the canary."""
    call = {"id": "call_0", "type": "function", "function": tool_call(city)}
    message = {"role": "assistant", "content": None, "tool_calls": [call]}
    return {
        "id": "x",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}],
        "usage": {"completion_tokens": 12},
    }


def stream_events(city: str) -> list[bytes]:
    """A correct SSE tool-call stream for the canary."""
    first = {"index": 0, "id": "call_0", "type": "function", "function": {"name": "get_weather"}}
    chunks = [
        {"choices": [{"index": 0, "delta": {"role": "assistant", "tool_calls": [first]}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": tool_call(city)["arguments"]}}]}}]},
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
    ]  # fmt: skip
    return [f"data: {json.dumps(c)}\n\n".encode() for c in chunks] + [b"data: [DONE]\n\n"]


def metrics_text() -> str:
    """A small valid exposition with the progress counters."""
    return (
        "# TYPE sglang:realtime_tokens_total counter\n"
        'sglang:realtime_tokens_total{mode="decode"} 10\n'
        'sglang:num_running_reqs{model_name="m"} 0\n'
    )


class HostileServer:
    """The misbehaving HTTP side; `mode` may be changed between requests."""

    def __init__(self, mode: str, port: int = 0) -> None:
        self.mode, self.port = mode, port
        self.rotate, self.turn = mode == "rotate", 0
        self.runner: web.AppRunner | None = None
        self.requests = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @web.middleware
    async def _rotate(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if self.rotate:
            self.turn += 1
            self.mode = ROTATION[self.turn % len(ROTATION)]
        return await handler(request)

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._rotate])
        app.router.add_get("/health", self.health)
        app.router.add_get("/server_info", self.json_endpoint)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_get("/metrics", self.metrics)
        return app

    async def start(self) -> None:
        self.runner = web.AppRunner(self.app(), access_log=None, shutdown_timeout=0.5)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", self.port)
        await site.start()
        server = getattr(site, "_server", None)
        if server is not None and server.sockets:
            self.port = int(server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()

    # ---- behaviours shared by the endpoints

    async def _huge(self, request: web.Request, content_type: str) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": content_type})
        await resp.prepare(request)
        block = b"x" * MiB
        try:
            for _ in range(HUGE_BYTES // MiB):
                await resp.write(block)
        except (ConnectionError, RuntimeError):
            return resp
        return resp

    async def _drip(self, request: web.Request, body: bytes, content_type: str) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": content_type})
        await resp.prepare(request)
        try:
            for i in range(len(body)):
                await resp.write(body[i : i + 1])
                await asyncio.sleep(1.0)
        except (ConnectionError, RuntimeError):
            return resp
        return resp

    async def _truncated(self, request: web.Request, body: bytes, content_type: str) -> web.StreamResponse:
        resp = web.StreamResponse(
            headers={"Content-Type": content_type, "Content-Length": str(len(body) * 4)}
        )
        await resp.prepare(request)
        await resp.write(body)
        if request.transport is not None:
            request.transport.close()
        return resp

    async def _common(
        self, request: web.Request, good: bytes, content_type: str
    ) -> web.StreamResponse | None:
        self.requests += 1
        if self.mode == "silent":
            await asyncio.sleep(3600)
        if self.mode == "huge_body":
            return await self._huge(request, content_type)
        if self.mode == "drip":
            return await self._drip(request, good, content_type)
        if self.mode == "slow_valid":
            await asyncio.sleep(SLOW_S)
        return None

    # ---- endpoints

    async def health(self, request: web.Request) -> web.StreamResponse:
        if self.mode in ("silent", "slow_valid"):
            await asyncio.sleep(3600 if self.mode == "silent" else SLOW_S)
        if self.mode == "huge_body":
            return await self._huge(request, "text/plain")
        return web.Response(status=200)

    async def json_endpoint(self, request: web.Request) -> web.StreamResponse:
        good = json.dumps({"tool_call_parser": "qwen25", "reasoning_parser": None}).encode()
        early = await self._common(request, good, "application/json")
        if early is not None:
            return early
        return self._json_like(good)

    def _json_like(self, good: bytes) -> web.Response:
        if self.mode == "invalid_json":
            return web.Response(body=b'{"choices": [{"message": ', content_type="application/json")
        if self.mode == "error_body":
            err = {"object": "error", "message": "internal", "type": "InternalServerError", "code": 500}
            return web.json_response(err, status=200)
        if self.mode == "wrong_content_type":
            return web.Response(body=b"<html><body>502 Bad Gateway</body></html>", content_type="text/html")
        if self.mode == "broken_sse":
            return web.Response(body=b"[" * 200_000, content_type="application/json")  # deep nesting
        return web.Response(body=good, content_type="application/json")

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        stream = bool(body.get("stream"))
        city = asked_city(body)
        good = b"".join(stream_events(city)) if stream else json.dumps(completion(city)).encode()
        kind = "text/event-stream" if stream else "application/json"
        early = await self._common(request, good, kind)
        if early is not None:
            return early
        if stream and self.mode == "broken_sse":
            return await self._broken_sse(request)
        if stream and self.mode == "wrong_content_type":
            return web.Response(body=json.dumps(completion(city)).encode(), content_type="application/json")
        if stream and self.mode in ("invalid_json", "error_body"):
            bad = (
                b'data: {"choices": [\n\n' if self.mode == "invalid_json" else b'data: {"error": "boom"}\n\n'
            )
            return web.Response(body=bad + b"data: [DONE]\n\n", content_type="text/event-stream")
        if stream:
            return web.Response(body=good, content_type="text/event-stream")
        return self._json_like(good)

    async def _broken_sse(self, request: web.Request) -> web.StreamResponse:
        """Several framing faults in one stream: odd types, a line with no end, never `[DONE]`."""
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        frames = [
            b'data: {"choices": 5}\n\n',
            b'data: {"choices": [{"delta": "text"}]}\n\n',
            b'data: {"choices": [{"delta": {"tool_calls": [{"index": "one"}]}}]}\n\n',
            b"data: 123\n\nevent: ping\n:comment\n\n",
        ]
        try:
            for frame in frames:
                await resp.write(frame)
            for _ in range(64):  # one line of 64 MiB with no newline
                await resp.write(b"y" * MiB)
        except (ConnectionError, RuntimeError):
            return resp
        return resp

    async def metrics(self, request: web.Request) -> web.StreamResponse:
        self.requests += 1
        good = metrics_text().encode()
        if self.mode == "metrics_million":
            return await self._million(request)
        if self.mode == "metrics_malformed":
            bad = (
                'sglang:realtime_tokens_total{mode="decode" 12\nsglang:x{a="\\"} NaNx\n\xff\xfe garbage {{{\n'
            )
            return web.Response(body=bad.encode("utf-8", "surrogateescape") + good, content_type="text/plain")
        if self.mode == "metrics_truncated":
            return await self._truncated(request, good, "text/plain")
        if self.mode == "wrong_content_type":
            return web.Response(body=b"<html>login required</html>", content_type="text/html")
        early = await self._common(request, good, "text/plain")
        if early is not None:
            return early
        if self.mode in ("invalid_json", "error_body", "broken_sse"):
            return web.Response(body=good, content_type="text/plain")
        return web.Response(body=good, content_type="text/plain; version=0.0.4")

    async def _million(self, request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/plain; version=0.0.4"})
        await resp.prepare(request)
        try:
            for block in range(1000):
                lines = "".join(
                    f'sglang:series_{block}{{id="{i}",model_name="m"}} {i}\n' for i in range(1000)
                )
                await resp.write(lines.encode())
        except (ConnectionError, RuntimeError):
            return resp
        return resp


def _rank(title: str) -> None:
    import setproctitle

    setproctitle.setproctitle(title)
    signal.pause()


async def _serve(mode: str, port: int) -> None:
    server = HostileServer(mode, port)
    await server.start()
    print(f"hostile server ({mode}) on {server.url}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.stop()


def main() -> None:
    """Entry point when launched in place of SGLang."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=30000)
    args, _ = parser.parse_known_args()
    ctx = multiprocessing.get_context("fork")
    ranks = [
        ctx.Process(target=_rank, args=(t,), daemon=True)
        for t in ("sglang::scheduler", "sglang::detokenizer")
    ]
    for rank in ranks:
        rank.start()
    try:
        asyncio.run(_serve(os.environ.get("HOSTILE_MODE", "invalid_json"), args.port))
    finally:
        for rank in ranks:
            rank.terminate()


if __name__ == "__main__":
    main()
