"""The simulated SGLang HTTP server (main process): routes, health, the info endpoints and the control endpoint.

The generation endpoints are in `simulator.generation`; error shapes in `simulator.errors`.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from simulator import auth, pd
from simulator.cli import SimServerArgs
from simulator.dp import DpEngines
from simulator.errors import MAX_BODY, error, error_body, read_json
from simulator.families import detect_family
from simulator.faults import FaultBook, ScenarioError, make_fault
from simulator.generation import Generation
from simulator.logs import log
from simulator.pause import PauseGate
from simulator.sim_metrics import SimMetrics, loads_body, render

CONTEXT_LEN = 131072
MAX_TOTAL_TOKENS = 1048576
# family -> (config model_type, architecture) of its flagship checkpoint
IDENTITY: dict[str, tuple[str, str]] = {
    "kimi_k2": ("kimi_k2", "DeepseekV3ForCausalLM"),
    "deepseekv3": ("deepseek_v3", "DeepseekV3ForCausalLM"),
    "deepseekv31": ("deepseek_v3", "DeepseekV3ForCausalLM"),
    "qwen25": ("qwen3", "Qwen3ForCausalLM"),
    "glm45": ("glm4_moe", "Glm4MoeForCausalLM"),
    "glm47": ("glm4_moe", "Glm4MoeForCausalLM"),
    "hermes": ("llama", "LlamaForCausalLM"),
}
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass
class SimState:
    """Mutable state of the main process shared by handlers and the lifecycle."""

    status: str = "Starting"  # "Starting" | "Up" | "UnHealthy"
    gracefully_exit: bool = False
    health_orphans: int = 0
    requests_by_endpoint: dict[str, int] = field(default_factory=dict)
    started_at: float = field(default_factory=time.time)
    launch_dirty: bool = False  # the previous run on this port did not exit cleanly


class SimServer:
    """Request handling on top of the engine."""

    def __init__(
        self,
        args: SimServerArgs,
        engine: DpEngines,
        metrics: SimMetrics,
        faults: FaultBook,
        state: SimState,
        on_fatal: Callable[[str], None],
    ) -> None:
        self.args = args
        self.engine = engine
        self.metrics = metrics
        self.faults = faults
        self.state = state
        self.on_fatal = on_fatal
        self.family = detect_family(args.model_path, os.environ.get("SGLANG_SIM_MODEL_FAMILY") or None)
        self.health_timeout = int(os.environ.get("SGLANG_HEALTH_CHECK_TIMEOUT", "20"))
        gen = os.environ.get("SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION", "true").strip().lower()
        self.health_generation = gen not in ("0", "false", "no", "off")
        self.control = os.environ.get("SGLANG_SIM_CONTROL", "") == "1"
        self.context_len = int(args.context_length or CONTEXT_LEN)
        self.pd = pd.PdSide(args, metrics, engine.first, faults)
        self.pause = PauseGate(engine, self.healthy)
        self.generation = Generation(
            args, engine, faults, self.pd, self.family, self.context_len, state.launch_dirty, on_fatal
        )
        self.generation.gate = self.pause

    def app(self) -> web.Application:
        """The aiohttp application with SGLang's routes."""
        app = web.Application(client_max_size=MAX_BODY, middlewares=[self._middleware])
        r = app.router
        for path in ("/health", "/health_generate"):
            r.add_get(path, self.health)
        self.pause.routes(r)
        for path in ("/model_info", "/get_model_info"):
            r.add_get(path, self.model_info)
        for path in ("/server_info", "/get_server_info"):
            r.add_get(path, self.server_info)
        r.add_get("/v1/models", self.models)
        r.add_get("/v1/models/{model:.+}", self.model)
        r.add_route("*", "/flush_cache", self.flush_cache)
        r.add_post("/abort_request", self.abort_request)
        r.add_get("/v1/loads", self.loads)
        r.add_get("/get_load", self.loads)
        r.add_post("/generate", self.generation.generate)
        r.add_put("/generate", self.generation.generate)
        r.add_post("/v1/chat/completions", self.generation.chat)
        if self.args.enable_metrics:
            r.add_get("/metrics", self.metrics_endpoint)
        if self.control:
            r.add_post("/sim/fault", self.sim_fault)
            r.add_get("/sim/state", self.sim_state)
        return app

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        path = (
            request.match_info.route.resource.canonical if request.match_info.route.resource else request.path
        )
        self.state.requests_by_endpoint[path] = self.state.requests_by_endpoint.get(path, 0) + 1
        self.metrics.tokenizer.http_begin(path, request.method)
        status = 500
        try:
            response = auth.denied(request, self.args.api_key, self.args.admin_api_key) or await handler(
                request
            )
            status = response.status
            return response
        except web.HTTPRequestEntityTooLarge:
            status = 413
            return error(413, f"Request body too large (limit {MAX_BODY} bytes)", "RequestEntityTooLarge")
        except (web.HTTPNotFound, web.HTTPMethodNotAllowed) as exc:
            status = exc.status
            return web.json_response({"detail": exc.reason}, status=status)  # FastAPI's body
        except web.HTTPException as exc:
            status = exc.status
            raise
        finally:
            self.metrics.tokenizer.http_end(path, request.method, status)

    async def health(self, request: web.Request) -> web.Response:
        """One handler for /health and /health_generate, decided as SGLang 0.5.23 does."""
        if self.state.gracefully_exit:
            log("Health check request received during shutdown. Returning 503.")
            return web.Response(status=503)
        if self.state.status == "Starting":
            return web.Response(status=503)
        if self.pd.prefill_lost and self.faults.get("prefill_replaced_decode_stale"):
            return web.Response(status=503)  # the #12779 variant: a replaced prefill fails decode's health
        if not self.health_generation and request.path == "/health":
            return web.Response(status=200)
        tic = time.time()
        submitted = False
        while time.time() < tic + self.health_timeout:
            # while paused it waits before the scheduler; on a decode, behind its pre-allocation queue (a prompt
            # the pool cannot fit blocks it: /health 503 after the timeout, as on the real decode)
            if not submitted and not self.pause.paused and not self.pd.prealloc:
                self.engine.submit_health()
                submitted = True
            await asyncio.sleep(1)
            if self.engine.last_receive_tstamp > tic:
                self.state.status = "Up"
                self._check_orphan(request)
                return web.Response(status=200)
        log(
            f"Health check failed. Server couldn't get a response from detokenizer for last {self.health_timeout} "
            f"seconds. tic start time: {time.strftime('%H:%M:%S', time.localtime(tic))}. last_heartbeat time: "
            f"{time.strftime('%H:%M:%S', time.localtime(self.engine.last_receive_tstamp))}"
        )
        self.state.status = "UnHealthy"
        self._check_orphan(request)
        return web.Response(status=503)

    def _check_orphan(self, request: web.Request) -> None:
        """health_probe_pileup: a probe whose client gave up leaves an orphan; five of them crash the server."""
        if request.transport is not None and not request.transport.is_closing():
            return
        self.state.health_orphans += 1
        if self.faults.get("health_probe_pileup") and self.state.health_orphans >= 5:
            self.faults.check("health_probe_pileup")
            log(
                "Scheduler hit an exception: Traceback (most recent call last):\n"
                f"RuntimeError: q.shape[0] (1) does not match qo_indptr[-1] ({self.state.health_orphans})",
                "TP0" if self.args.tp_size > 1 else "",
            )
            self.on_fatal("sigquit")

    def healthy(self) -> bool:
        """SGLang's `is_healthy()`: started, not shutting down, and no `/health` failed since the last success."""
        return not self.state.gracefully_exit and self.state.status == "Up"

    async def model_info(self, request: web.Request) -> web.Response:
        """Served from the main process only: answers even when the scheduler is wedged."""
        if request.path == "/get_model_info":
            log(
                "Endpoint '/get_model_info' is deprecated and will be removed in a future version. Please use '/model_info' instead."
            )
        model_type, architecture = IDENTITY[self.family]
        return web.json_response(
            {
                "model_path": self.args.model_path,
                "tokenizer_path": self.args.model_path,
                "is_generation": True,
                "preferred_sampling_params": None,
                "weight_version": "default",
                "has_image_understanding": False,
                "has_audio_understanding": False,
                "model_type": model_type,
                "architectures": [architecture],
            }
        )

    async def server_info(self, request: web.Request) -> web.Response:
        """server_args plus scheduler state; needs a scheduler round-trip, so it hangs while the ranks are wedged."""
        while self.engine.stalled:
            await asyncio.sleep(1)
        info: dict[str, Any] = dict(self.args.server_info())
        info.update(
            {
                "scheduler_info": {
                    "status": "ready",
                    "max_total_num_tokens": MAX_TOTAL_TOKENS,
                    "max_req_input_len": self.context_len - 6,
                },
                "internal_states": [
                    {"last_gen_throughput": e.metrics.gauges["gen_throughput"]} for e in self.engine.engines
                ],
                "version": "0.5.23",
            }
        )
        return web.json_response(info)

    async def models(self, request: web.Request) -> web.Response:
        """The served model as an OpenAI model list."""
        return web.json_response({"object": "list", "data": [self._model_card()]})

    def _model_card(self) -> dict[str, Any]:
        return {
            "id": self.args.served_name,
            "object": "model",
            "created": int(self.state.started_at),
            "owned_by": "sglang",
            "root": self.args.served_name,
            "parent": None,
            "max_model_len": self.context_len,
        }

    async def model(self, request: web.Request) -> web.Response:
        """One model card, or 404 model_not_found."""
        name = request.match_info["model"]
        if name != self.args.served_name:
            body = error_body(404, f"The model '{name}' does not exist", "NotFoundError")
            body["code"] = "model_not_found"
            return web.json_response(body, status=404)
        return web.json_response(self._model_card())

    async def flush_cache(self, request: web.Request) -> web.Response:
        """Flushes only when idle: 200 "Cache flushed.", else 400 "Cache not flushed."; hangs with the scheduler."""
        while self.engine.stalled:
            await asyncio.sleep(1)
        busy = self.engine.load > 0
        return web.Response(
            status=400 if busy else 200,
            text=f"Cache {'not flushed' if busy else 'flushed'}.\nPlease check backend logs for more details. "
            "(When there are running or waiting requests, the operation will not be performed.)\n",
        )

    async def abort_request(self, request: web.Request) -> web.Response:
        """SGLang's `POST /abort_request {"rid", "abort_all"}`: 200 whatever it finds; `abort_all` ends every
        request (those parked in a PD queue too), a `rid` that request."""
        body = await read_json(request)
        if isinstance(body, web.Response):
            return body
        if body.get("abort_all"):
            self.engine.abort_all()
            self.pd.abort_all()
        elif isinstance(body.get("rid"), str):
            await asyncio.to_thread(self.engine.abort, body["rid"])
        return web.Response(status=200)

    async def loads(self, request: web.Request) -> web.Response:
        """The shared-memory load snapshot of each DP rank; its `timestamp` freezes with the scheduler."""
        queues = (len(self.pd.prealloc), len(self.pd.bootstrapping))
        entries = [
            e.metrics.load_entry(
                e.snapshot_at,
                MAX_TOTAL_TOKENS,
                self.pd.mode,
                e.parked,
                queues if e is self.engine.first else (0, 0),
                e.batch_size(),
            )
            for e in self.engine.engines
        ]
        return web.json_response(loads_body(entries, len(self.engine.first.conns)))

    async def metrics_endpoint(self, request: web.Request) -> web.Response:
        """Prometheus text; served by the main process, so it answers while the ranks are wedged."""
        body = render([e.metrics for e in self.engine.engines])
        return web.Response(text=body, content_type="text/plain", charset="utf-8")

    async def sim_fault(self, request: web.Request) -> web.Response:
        """Inject a fault live (only with SGLANG_SIM_CONTROL=1)."""
        body = await read_json(request)
        if isinstance(body, web.Response):
            return body
        if not isinstance(body, dict):
            return error(400, "a JSON object with a fault name is expected")
        try:
            fault = make_fault(body)
        except ScenarioError as exc:
            return error(400, str(exc))
        armed = self.faults.arm(fault, persist=True)
        return web.json_response({"armed": armed, "fault": fault.describe()})

    async def sim_state(self, request: web.Request) -> web.Response:
        """Armed faults, when each fired, and request counts per endpoint (only with SGLANG_SIM_CONTROL=1)."""
        data = self.faults.state()
        data.update(
            {
                "pid": os.getpid(),
                "status": self.state.status,
                "wedged": self.engine.wedged or None,
                "requests_by_endpoint": dict(self.state.requests_by_endpoint),
                "uptime_s": time.time() - self.state.started_at,
                "family": self.family,
            }
        )
        return web.json_response(data)
