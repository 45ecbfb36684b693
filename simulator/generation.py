"""The generation endpoints: native /generate and OpenAI chat completions, whole or streamed as SSE."""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from aiohttp import web

from simulator import pd
from simulator.cli import SimServerArgs
from simulator.dp import DpEngines, RouteError
from simulator.errors import error, read_json
from simulator.families import ChatRequest, generate_chat, generate_text
from simulator.faults import FaultBook
from simulator.logs import log
from simulator.openai_api import ApiError, chat_chunk, chat_completion, parse_chat_request, usage_chunk
from simulator.parsers.chat import StreamParser, chunk_tokens, parse_complete
from simulator.pause import PauseGate
from simulator.reqlog import RequestLog
from simulator.request import Req


class Generation:
    """Requests admitted to the engine, their tokens parsed by the configured parsers and sent back."""

    def __init__(
        self,
        args: SimServerArgs,
        engine: DpEngines,
        faults: FaultBook,
        pd_side: pd.PdSide,
        family: str,
        context_len: int,
        launch_dirty: bool,
        on_fatal: Callable[[str], None],
    ) -> None:
        self.args = args
        self.engine = engine
        self.faults = faults
        self.pd = pd_side
        self.family = family
        self.context_len = context_len
        self.launch_dirty = launch_dirty  # the previous run on this port did not exit cleanly
        self.on_fatal = on_fatal
        self.seed = int(os.environ.get("SGLANG_SIM_SEED", "0") or 0)
        self.rng = random.Random(self.seed)
        self.served = 0
        self.streams = 0
        self.stuck = 0  # requests the request_stuck fault has held
        self.requests_log = RequestLog(args)
        self.gate: PauseGate | None = None  # the tokenizer's pause: new requests wait here

    def _too_long(self, prompt_tokens: int) -> str:
        """SGLang's context-length check of the tokenized input ("" when it fits)."""
        if prompt_tokens < self.context_len:
            return ""
        return f"The input ({prompt_tokens} tokens) is longer than the model's context length ({self.context_len} tokens)."

    def _admit(self) -> bool:
        """Count a user request; False when restart_same_port_hang makes it hang."""
        self.faults.count_request()
        self.served += 1
        if self.launch_dirty and self.faults.check("restart_same_port_hang"):
            fault = self.faults.get("restart_same_port_hang")
            limit = int(fault.params.get("after_requests", 100)) if fault else 100
            return self.served <= limit
        return True

    def _routed(self, body: dict[str, Any]) -> int | str | None:
        """The DP rank a request names (`routed_dp_rank`), None when it names none, or why it cannot be routed."""
        rank = body.get("routed_dp_rank")
        if rank is None:
            return None
        if not isinstance(rank, int) or isinstance(rank, bool):
            return f"routed_dp_rank={rank!r} is not an integer"
        try:
            self.engine.route(rank)
        except RouteError as exc:
            return str(exc)
        return rank

    async def _submit(
        self,
        tokens: list[str],
        prompt_tokens: int,
        finish: str,
        routed: int | None = None,
        logged: tuple[str, dict[str, Any], bool] | None = None,
    ) -> asyncio.Queue[tuple[list[str], bool, str]]:
        """Queue a request on the engine; `logged` is its (rid, sampling parameters, stream) for the request log."""
        if self.gate is not None:
            await self.gate.wait_open()
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[list[str], bool, str]] = asyncio.Queue()
        rid, sampling, stream = logged or (uuid.uuid4().hex, {}, False)
        started = self.requests_log.received(rid, sampling, stream)
        sent = [0]

        def sink(new: list[str], done: bool, reason: str) -> None:
            sent[0] += len(new)
            if done:
                self.requests_log.finished(rid, sampling, stream, reason, sent[0], started)
            loop.call_soon_threadsafe(queue.put_nowait, (new, done, reason))

        req = Req(rid, tokens, prompt_tokens, finish, sink)
        fault = self.faults.get("request_stuck")
        if fault and self.faults.check("request_stuck") and self.stuck < int(fault.params.get("count", 1)):
            self.stuck += 1  # this request never gets a token; `unabortable`: nor does an abort end it
            req.stuck = "unabortable" if fault.params.get("unabortable") else "stuck"
        self.engine.submit(req, routed)
        return queue

    async def generate(self, request: web.Request) -> web.StreamResponse:
        """Native /generate (used by SGLang's warmup and by PD routers)."""
        body = await read_json(request)
        if isinstance(body, web.Response):
            return body
        if not isinstance(body, dict) or not ("text" in body or "input_ids" in body):
            return web.json_response(
                {"error": {"message": "Either text or input_ids should be provided."}}, status=400
            )
        params = body.get("sampling_params") or {}
        max_new = int(params.get("max_new_tokens", 128)) if isinstance(params, dict) else 128
        prompt = (
            body.get("text")
            if isinstance(body.get("text"), str)
            else " ".join(map(str, body.get("input_ids", [])))
        )
        too_long = self._too_long(max(1, len(str(prompt)) // 4))
        routed = self._routed(body)
        if too_long or isinstance(routed, str):
            return web.json_response({"error": {"message": too_long or routed}}, status=400)
        gate = await self.pd.gate(body, openai=False, prompt_tokens=max(1, len(str(prompt)) // 4))
        if gate is not None:
            return gate
        if not self._admit():
            await asyncio.Event().wait()
        tokens = generate_text(str(prompt), max(1, max_new), self.seed)
        if isinstance(params, dict) and params.get("ignore_eos"):
            tokens = (tokens * (max_new // len(tokens) + 1))[
                : max(1, max_new)
            ]  # no EOS: exactly max_new_tokens
        rid = body["rid"] if isinstance(body.get("rid"), str) else uuid.uuid4().hex
        logged = (rid, dict(params) if isinstance(params, dict) else {}, bool(body.get("stream")))
        queue = await self._submit(tokens, max(1, len(str(prompt)) // 4), "length", routed, logged)
        out: list[str] = []
        reason = "length"
        if body.get("stream"):
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            while True:
                new, done, reason = await queue.get()
                out += new
                await resp.write(f"data: {json.dumps({'text': ''.join(out), 'meta_info': {}})}\n\n".encode())
                if done:
                    break
            await resp.write(b"data: [DONE]\n\n")
            return resp
        while True:
            new, done, reason = await queue.get()
            out += new
            if done:
                break
        self.pd.after_prefill(body)
        return web.json_response(
            {
                "text": "".join(out),
                "output_ids": list(range(len(out))),
                "meta_info": {
                    "id": uuid.uuid4().hex,
                    "finish_reason": (
                        {"type": "abort", "message": "Aborted"}
                        if reason == "abort"
                        else {"type": reason, "length": len(out)}
                    ),
                    "prompt_tokens": max(1, len(str(prompt)) // 4),
                    "completion_tokens": len(out),
                    "cached_tokens": 0,
                    "weight_version": "default",
                },
            }
        )

    async def chat(self, request: web.Request) -> web.StreamResponse:
        """OpenAI chat completions, streamed or not, parsed only by the configured parsers."""
        body = await read_json(request)
        if isinstance(body, web.Response):
            return body
        parsed = parse_chat_request(body)
        if isinstance(parsed, ApiError):
            return web.json_response(parsed.body, status=parsed.status)
        prompt_tokens = max(1, len(json.dumps(body.get("messages", []))) // 4)
        too_long = self._too_long(prompt_tokens)
        routed = self._routed(body)
        if too_long or isinstance(routed, str):
            return error(400, too_long or str(routed))
        gate = await self.pd.gate(body, prompt_tokens=prompt_tokens)
        if gate is not None:
            return gate
        if not self._admit():
            await asyncio.Event().wait()
        tokens, raw_finish = generate_chat(self.family, self.args.model_path, parsed, self.seed)
        sampling = {"temperature": body.get("temperature", 1.0), "max_new_tokens": body.get("max_tokens")}
        logged = (uuid.uuid4().hex, sampling, bool(body.get("stream")))
        queue = await self._submit(tokens, prompt_tokens, raw_finish, routed, logged)
        cid, created, model = f"{uuid.uuid4().hex}", int(time.time()), self.args.served_name
        if body.get("stream"):
            return await self._chat_stream(request, body, parsed, queue, (cid, created, model), prompt_tokens)
        text_parts: list[str] = []
        while True:
            new, done, reason = await queue.get()
            text_parts += new
            if done:
                break
        self.pd.after_prefill(body)
        msg = parse_complete(
            "".join(text_parts),
            tool_parser=self.args.tool_call_parser,
            reasoning_parser=self.args.reasoning_parser,
            tools=parsed.tools,
            tool_choice=parsed.tool_choice,
            raw_finish_reason=reason,
            chat_template_kwargs=parsed.chat_template_kwargs,
        )
        return web.json_response(chat_completion(cid, model, created, msg, prompt_tokens, len(text_parts)))

    async def _chat_stream(
        self,
        request: web.Request,
        body: dict[str, Any],
        parsed: ChatRequest,
        queue: asyncio.Queue[tuple[list[str], bool, str]],
        ident: tuple[str, int, str],
        prompt_tokens: int,
    ) -> web.StreamResponse:
        cid, created, model = ident
        self.streams += 1
        leak = (
            self.faults.check("tool_markup_leak_under_load", concurrency=self.streams)
            and self.rng.random() < 0.5
        )
        parser = StreamParser(
            tool_parser=None if leak else self.args.tool_call_parser,
            reasoning_parser=self.args.reasoning_parser,
            tools=parsed.tools,
            tool_choice=parsed.tool_choice,
            chat_template_kwargs=parsed.chat_template_kwargs,
        )
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        try:
            await resp.prepare(request)
            await self._sse(resp, chat_chunk(cid, model, created, {"role": "assistant", "content": ""}, None))
            n_out, pending, reason = 0, [], "stop"
            interval = max(1, int(self.args.stream_interval))
            async for new, done, why in _drain(queue):
                reason = why or reason
                pending += new
                n_out += len(new)
                if len(pending) >= interval or done:
                    for text in chunk_tokens(pending, interval):
                        for delta in parser.feed(text):
                            await self._sse(resp, chat_chunk(cid, model, created, delta, None))
                    pending = []
            tail, finish = parser.finish(reason)
            for delta in tail:
                await self._sse(resp, chat_chunk(cid, model, created, delta, None))
            await self._sse(resp, chat_chunk(cid, model, created, {}, finish))
            options = body.get("stream_options") or {}
            if isinstance(options, dict) and options.get("include_usage"):
                await self._sse(resp, usage_chunk(cid, model, created, prompt_tokens, n_out))
            await resp.write(b"data: [DONE]\n\n")
            self.pd.after_prefill(body)
        except (ConnectionResetError, asyncio.CancelledError):
            if self.faults.count_disconnect() and self.faults.check("abort_storm_tokenizer_crash"):
                log("TokenizerManager hit an exception: Traceback (most recent call last):\nKeyError: 'rid'")
                self.on_fatal("exit")
            raise
        finally:
            self.streams -= 1
        return resp

    async def _sse(self, resp: web.StreamResponse, data: dict[str, Any]) -> None:
        await resp.write(f"data: {json.dumps(data, ensure_ascii=False)}\n\n".encode())


async def _drain(
    queue: asyncio.Queue[tuple[list[str], bool, str]],
) -> AsyncIterator[tuple[list[str], bool, str]]:
    while True:
        item = await queue.get()
        yield item
        if item[1]:
            return
