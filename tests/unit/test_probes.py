"""Probes against recorded bodies and fakes: metrics parsing, the progress lease, SSE reassembly, stacks, GPUs."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from policies.leaks import FAIL, INCONCLUSIVE, PASS
from policies.model import ProbeSettings, TreeView
from policies.triage import ServerFacts, TreeFacts, Triage, triage
from probes.base import error_message
from probes.canary import chat, from_json, reassemble, tool_canary
from probes.gpu_probe import GpuWatch
from probes.health import probe_health
from probes.loads import PdLoads, pd_summary, read_loads
from probes.logwatch import LogWatch
from probes.monitor import ROUTINE_KEEP_S, Monitor
from probes.pd_pair import PdPair
from probes.progress import ProgressTracker, parse_metrics, progress_counters
from probes.stacks import classify, observe_ranks, parse_dump
from supervisor.host.aborts import abort_all
from tests.support.ports import free_port

METRICS = """# HELP sglang:num_running_reqs num_running_reqs
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="m",engine_type="decode",tp_rank="0"} 2.0
sglang:num_decode_transfer_queue_reqs{model_name="m",engine_type="decode",tp_rank="0"} 3.0
sglang:realtime_tokens_total{model_name="m",tp_rank="0",mode="decode"} 100.0
sglang:realtime_tokens_total{model_name="m",tp_rank="0",mode="prefill_compute"} 50.0
sglang:cuda_graph_passes_total{model_name="m",tp_rank="0",mode="decode_cuda_graph"} 10
sglang:inter_token_latency_seconds_count{model_name="m"} 90
sglang:http_requests_active{endpoint="/v1/chat/completions",method="POST"} ACTIVE
sglang:http_requests_active{endpoint="/health",method="GET"} 1
sglang:weird{label="a,b=\\"c\\""} 1e3
not a metric line
"""


def metrics(active: int = 1, decode: float = 100.0) -> str:
    return METRICS.replace("ACTIVE", str(active)).replace("} 100.0", f"}} {decode}")


def test_parse_metrics_labels_and_values() -> None:
    """Labels with commas and escaped quotes parse; comments and junk are skipped."""
    samples = parse_metrics(metrics())
    weird = next(s for s in samples if s.name == "sglang:weird")
    assert weird.value == 1000.0 and weird.labels == {"label": 'a,b=\\"c\\"'}
    assert progress_counters(samples) == {
        "decode_tokens": 100.0,
        "prefill_tokens": 50.0,
        "decode_passes": 10.0,
        "streamed_tokens": 90.0,
    }


def test_lease_counts_a_stall_only_while_work_waits() -> None:
    """Flat counters with a generation request active stall; moving counters or no work do not."""
    t = ProgressTracker()
    t.reset(0.0)
    assert t.update(parse_metrics(metrics(decode=1)), 1.0).values["stalled_s"] == 0.0
    assert t.update(parse_metrics(metrics(decode=2)), 5.0).values["stalled_s"] == 0.0
    obs = t.update(parse_metrics(metrics(decode=2)), 30.0)
    assert obs.values["stalled_s"] == 25.0 and obs.values["work_reasons"] == ["generation_requests_active"]
    idle = t.update(parse_metrics(metrics(active=0, decode=2)), 40.0)
    assert idle.values["work"] is False and idle.values["stalled_s"] == 0.0


def test_frozen_running_gauge_counts_only_without_http_gauge() -> None:
    """A stale num_running_reqs is work only when the live HTTP gauge is absent."""
    t = ProgressTracker()
    t.reset(0.0)
    assert t.update(parse_metrics(metrics(active=0)), 1.0).values["work"] is False
    no_http = "\n".join(line for line in metrics().splitlines() if "http_requests_active" not in line)
    assert t.update(parse_metrics(no_http), 2.0).values["work_reasons"] == ["num_running_reqs"]


def test_other_progress_and_own_canary() -> None:
    """Our outstanding canary is work; a log batch line or busy GPU is progress."""
    t = ProgressTracker()
    t.reset(0.0)
    t.update(parse_metrics(metrics(active=0)), 1.0)
    obs = t.update(parse_metrics(metrics(active=0)), 10.0, canary_outstanding=True)
    assert obs.values["work_reasons"] == ["canary_outstanding"]
    obs = t.update(parse_metrics(metrics(active=0)), 30.0, canary_outstanding=True, other_progress_at=29.0)
    assert obs.values["stalled_s"] == 1.0


def test_pd_queue_that_neither_drains_nor_decodes() -> None:
    """Decode role: a transfer queue stuck at 3 with no request's token accumulates pd_stalled_s.

    The scheduler's decode counter moving is SGLang's own health check (a fake bootstrap, past the queue): not
    progress. A request's token (the tokenizer's inter-token count) is.
    """
    t = ProgressTracker(role="decode")
    t.reset(0.0)
    t.update(parse_metrics(metrics()), 1.0)
    assert t.update(parse_metrics(metrics()), 21.0).values["pd_stalled_s"] == 20.0
    assert t.update(parse_metrics(metrics(decode=500)), 22.0).values["pd_stalled_s"] == 21.0
    streamed = metrics(decode=500).replace(
        'inter_token_latency_seconds_count{model_name="m"} 90',
        'inter_token_latency_seconds_count{model_name="m"} 91',
    )
    assert t.update(parse_metrics(streamed), 23.0).values["pd_stalled_s"] == 0.0


def test_pd_queue_shrinking_without_decode_progress_is_still_stalled() -> None:
    """Requests aborted or timed out leave the transfer queue too: only decoded tokens restart the count."""
    t = ProgressTracker(role="decode")
    t.reset(0.0)
    t.update(parse_metrics(metrics()), 1.0)
    shrunk = metrics().replace(
        'num_decode_transfer_queue_reqs{model_name="m",engine_type="decode",tp_rank="0"} 3.0',
        'num_decode_transfer_queue_reqs{model_name="m",engine_type="decode",tp_rank="0"} 1.0',
    )
    assert shrunk != metrics()
    assert t.update(parse_metrics(shrunk), 6.0).values["pd_stalled_s"] == 5.0


def test_idle_at_is_the_last_scrape_with_nothing_in_flight_queued_or_in_a_pd_queue() -> None:
    """A prefill is idle when no request is in flight, queued or in its PD queues; a failed scrape tells nothing.

    The running gauge keeps its last value while the scheduler idles: beside the live HTTP gauge it does not
    count (as for work).
    """
    t = ProgressTracker(role="prefill")
    t.reset(0.0)
    assert t.update(parse_metrics(metrics()), 1.0).values["idle_at"] is None  # one request active
    idle = metrics(active=0)  # num_running_reqs still 2: stale
    assert t.update(parse_metrics(idle), 2.0).values["idle_at"] == 2.0
    assert t.update(None, 3.0, error="timeout").values["idle_at"] == 2.0
    queued = idle + 'sglang:num_queue_reqs{model_name="m"} 4\n'
    assert t.update(parse_metrics(queued), 4.0).values["idle_at"] == 2.0
    inflight = idle + 'sglang:num_prefill_inflight_queue_reqs{model_name="m"} 1\n'
    assert t.update(parse_metrics(inflight), 5.0).values["idle_at"] == 2.0


def test_failed_scrape_is_an_observation() -> None:
    """No metrics: ok=False with the error, never an exception."""
    t = ProgressTracker()
    t.reset(0.0)
    obs = t.update(None, 1.0, error="HTTP 404")
    assert not obs.ok and "HTTP 404" in obs.detail


PYSPY = """Process 4242: sglang::scheduler_TP1
Python v3.11.7 (/usr/bin/python3.11)

Thread 4242 (idle): "MainThread"
    wait (threading.py:331)
    _wait (threading.py:732)
    all_reduce (sglang/srt/distributed/parallel_state.py:512)
    forward (sglang/srt/models/deepseek_v2.py:100)
Thread 4250 (idle): "watchdog"
    broadcast (x.py:1)
"""


def test_parse_dump_and_classify_innermost_collective() -> None:
    """The main thread comes first; its innermost collective-like frame names the collective."""
    threads = parse_dump(PYSPY)
    assert threads[0][0] == "wait (threading.py:331)"
    assert classify(threads[0]) == ("all_reduce", "all_reduce (sglang/srt/distributed/parallel_state.py:512)")
    assert (
        classify(["recv (multiprocessing/connection.py:1)", "recv_requests (ranks.py:2)"])[0]
        == "recv_requests"
    )
    assert classify(["forward (m.py:1)"]) == (None, None)


def test_ranks_observation_reports_lost_ranks_and_cpu_advance() -> None:
    """Missing/zombie ranks fail the probe; CPU time advancing is evidence per rank."""
    obs = observe_ranks(TreeView(rank_cpu_s={"TP0": 2.0, "TP1": 1.0}), {"TP0": 1.0, "TP1": 1.0}, 5.0)
    assert obs.ok and obs.values["cpu_advancing"] == {"TP0": True, "TP1": False}
    assert not observe_ranks(TreeView(missing_ranks=("TP1",)), {}, 5.0).ok


def test_gpu_spin_busy_and_xids_once() -> None:
    """Spin = ≥95 % at ≤35 % power; busy = real power; each Xid is reported once; old Xids are ignored."""
    watch = GpuWatch(started_wall=1000.0)
    gpus = [
        {
            "index": 0,
            "utilization_gpu": 99.5,
            "power_w": 120,
            "power_limit_w": 700,
            "xid_events": [{"xid": 79, "at": 1001}],
        },
        {
            "index": 1,
            "utilization_gpu": 90,
            "power_w": 500,
            "power_limit_w": 700,
            "xid_events": [{"xid": 13, "at": 10}],
        },
    ]
    first = watch.observe(lambda: gpus, 1.0)
    assert first.values["spin"] == [0] and first.values["busy"] == [1]
    assert first.values["xids"] == [{"index": 0, "xid": 79, "at": 1001.0}] and not first.ok
    assert watch.observe(lambda: gpus, 2.0).values["xids"] == []


async def test_an_xid_reported_by_one_launch_is_not_reported_by_the_next() -> None:
    """The relaunch after a GPU fault (an operator's restart) does not fail again on the Xid already acted on."""
    event = {"xid": 79, "at": time.time()}
    gpus = [{"index": 0, "utilization_gpu": 0, "power_w": 90, "xid_events": [event]}]
    seen: set[tuple[int, int, float]] = set()
    xids = []
    for _ in range(2):  # two launches of one server
        monitor = Monitor(
            server="s", role="unified", base_url="http://127.0.0.1:9", model="m", settings=ProbeSettings(),
            tree=TreeView, gpu=lambda: gpus, log_lines=list, pids_for_stacks=dict, xids_seen=seen,
        )  # fmt: skip
        try:
            xids += [o.values["xids"] for o in await monitor.tick(time.monotonic()) if o.probe == "gpu"]
        finally:
            await monitor.aclose()
    assert xids == [[{"index": 0, **event}], []]


def test_gpu_reader_error_is_an_observation() -> None:
    """A failing GPU backend gives ok=False, never an exception."""

    def broken() -> list[dict[str, Any]]:
        raise OSError("nvml gone")

    assert not GpuWatch().observe(broken, 1.0).ok


def test_logwatch_progress_ready_and_hits() -> None:
    """Progress lines move last_progress_at; fatal lines become hits; ready is remembered."""
    watch = LogWatch()
    obs = watch.observe(
        ["[t TP0] Load weight begin. avail mem=1 GB", "[t] Scheduler hit an exception: x"], 5.0
    )
    assert obs.values["last_progress_at"] == 5.0 and not obs.ok
    assert obs.values["hits"][0]["kind"] == "crash"
    obs = watch.observe(["[t] The server is fired up and ready to roll!"], 6.0)
    assert obs.values["ready"] and obs.ok
    flood = watch.observe(["KV cache pool is full. Retract requests. #retracted_reqs: 1"] * 50, 7.0)
    assert len(flood.values["hits"]) == 20 and flood.values["dropped_hits"] == 30


KIMI_NON_STREAM = {
    "id": "x",
    "object": "chat.completion",
    "choices": [
        {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": "",
                "reasoning_content": None,
                "tool_calls": [
                    {
                        "id": "functions.get_weather:0",
                        "index": 0,
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                    }
                ],
            },
            "finish_reason": "tool_calls",
        }
    ],
    "usage": {"prompt_tokens": 200, "completion_tokens": 20, "total_tokens": 220},
}


def sse(*events: dict[str, Any], done: bool = True) -> bytes:
    out = b"".join(f"data: {json.dumps(e)}\n\n".encode() for e in events)
    return out + (b"data: [DONE]\n\n" if done else b"")


def delta(d: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": d, "finish_reason": finish}]}


def tc(index: int, call_id: str | None, name: str | None, args: str) -> dict[str, Any]:
    return {"tool_calls": [{"index": index, "id": call_id, "function": {"name": name, "arguments": args}}]}


GOOD_STREAM = [
    delta({"role": "assistant", "content": ""}),
    delta(tc(0, "functions.get_weather:0", "get_weather", "")),
    delta(tc(0, None, None, '{"city": ')),
    delta(tc(0, None, None, '"Paris"}')),
    delta({}, "tool_calls"),
    {"choices": [], "usage": {"completion_tokens": 20}},
]


def test_recorded_bodies_reassemble() -> None:
    """A kimi_k2 non-stream body and its stream give the same call."""
    plain = from_json(KIMI_NON_STREAM)
    streamed = reassemble(GOOD_STREAM, done=True)
    assert plain.calls == streamed.calls
    assert streamed.finish_reason == "tool_calls" and streamed.completion_tokens == 20


def test_stream_structure_errors() -> None:
    """Arguments before the name, two names for one index, a missing [DONE] and in-band errors are caught."""
    early = reassemble(
        [delta(tc(0, None, None, "{")), delta(tc(0, "a", "get_weather", "}")), delta({}, "tool_calls")], True
    )
    assert "arguments before the name for call 0" in early.stream_errors
    twice = reassemble(
        [delta(tc(0, "a", "get_weather", "{}")), delta(tc(0, "b", "function", "")), delta({}, "tool_calls")],
        True,
    )
    assert "call 0 has several ids or names" in twice.stream_errors
    assert reassemble(GOOD_STREAM, done=False).status is None
    assert reassemble([{"error": {"message": "boom"}}], True).error.startswith("in-stream error")


class FakeServer:
    """A local aiohttp server replaying recorded bodies."""

    def __init__(self) -> None:
        self.health_status = 200
        self.health_delay = 0.0
        self.stream_body = sse(*GOOD_STREAM)
        self.plain_body: bytes = json.dumps(KIMI_NON_STREAM).encode()
        self.metrics = metrics(active=0)
        self.requests: list[str] = []
        self.rooms: list[object] = []  # the bootstrap room of each chat request (None without one)
        self.loads: list[dict[str, object]] = []
        self.aborts: list[object] = []
        self.chat_status = 200

    async def health(self, request: web.Request) -> web.Response:
        self.requests.append("/health")
        await asyncio.sleep(self.health_delay)
        return web.Response(status=self.health_status)

    async def chat(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append("/v1/chat/completions")
        self.rooms.append(body.get("bootstrap_room"))
        if body.get("stream"):
            return web.Response(body=self.stream_body, content_type="text/event-stream")
        return web.Response(body=self.plain_body, status=self.chat_status, content_type="application/json")

    async def metrics_h(self, request: web.Request) -> web.Response:
        self.requests.append("/metrics")
        return web.Response(text=self.metrics)

    async def server_info(self, request: web.Request) -> web.Response:
        return web.json_response({"tool_call_parser": "kimi_k2", "reasoning_parser": None})

    async def v1_loads(self, request: web.Request) -> web.Response:
        return web.json_response({"loads": self.loads})

    async def abort(self, request: web.Request) -> web.Response:
        self.aborts.append(await request.json())
        return web.Response(status=200)


@pytest.fixture
async def fake() -> AsyncIterator[tuple[FakeServer, str]]:
    server = FakeServer()
    app = web.Application()
    app.router.add_get("/health", server.health)
    app.router.add_post("/v1/chat/completions", server.chat)
    app.router.add_get("/metrics", server.metrics_h)
    app.router.add_get("/server_info", server.server_info)
    app.router.add_get("/v1/loads", server.v1_loads)
    app.router.add_post("/abort_request", server.abort)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield server, f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def test_health_by_status_code(fake: tuple[FakeServer, str]) -> None:
    """200 is ok, 503 is not; a closed port is 'refused'; a slow answer is a timeout."""
    server, url = fake
    async with aiohttp.ClientSession() as session:
        assert (await probe_health(session, url, 5)).ok
        server.health_status = 503
        obs = await probe_health(session, url, 5)
        assert not obs.ok and obs.values["status"] == 503
        refused = await probe_health(session, f"http://127.0.0.1:{free_port()}", 5)
        assert refused.values["refused"] and not refused.ok
        server.health_delay = 1.0
        slow = await probe_health(session, url, 0.2)
        assert slow.values["timeout"] and slow.values["status"] is None


async def test_tool_canary_verdicts_from_recorded_bodies(fake: tuple[FakeServer, str]) -> None:
    """Recorded kimi_k2 bodies pass; raw markup in content fails; a cut-off stream is inconclusive."""
    server, url = fake
    settings = ProbeSettings(canary_timeout_s=5)
    async with aiohttp.ClientSession() as session:
        assert (await tool_canary(session, url, "m", settings)).values["verdict"] == PASS
        server.stream_body = sse(*GOOD_STREAM, done=False)
        assert (await tool_canary(session, url, "m", settings)).values["verdict"] == INCONCLUSIVE
        leak = dict(KIMI_NON_STREAM)
        leak["choices"] = [{"message": {"content": "<|tool_calls_section_begin|>x"}, "finish_reason": "stop"}]
        server.plain_body = json.dumps(leak).encode()
        failed = await tool_canary(session, url, "m", settings)
        assert failed.values["verdict"] == FAIL and "<|tool_calls_section_begin|>" in failed.values["leaks"]


async def test_an_error_answer_keeps_sglangs_own_message(fake: tuple[FakeServer, str]) -> None:
    """A canary answered 500 is inconclusive and says why in SGLang's words (a decode that cannot reach the
    prefill's bootstrap server), in one bounded line."""
    server, url = fake
    message = (
        "Decode handshake failed for request rank=0 … with exception KVTransferError(bootstrap_room=7):\n"
    )
    server.plain_body = json.dumps({"object": "error", "message": message + "x" * 500, "code": 500}).encode()
    server.chat_status = 500
    async with aiohttp.ClientSession() as session:
        obs = await tool_canary(session, url, "m", ProbeSettings(canary_timeout_s=5))
    reason = str(obs.values["reason"])
    assert obs.values["verdict"] == INCONCLUSIVE
    assert reason.startswith("non-stream: HTTP 500: Decode handshake failed for request rank=0")
    assert "\n" not in reason
    assert len(reason) < 300


@pytest.mark.parametrize(
    ("raw", "said"),
    [
        (b'{"error": {"message": "no workers", "code": 503}}', "no workers"),
        (b'{"error": "insufficient healthy workers"}', "insufficient healthy workers"),
        (b"Service Unavailable\r\n", "Service Unavailable"),
        (b"", ""),
    ],
)
def test_error_message_reads_each_shape_of_error_body(raw: bytes, said: str) -> None:
    assert error_message(raw) == said


async def test_chat_reads_are_bounded(fake: tuple[FakeServer, str]) -> None:
    """A stream larger than the cap is abandoned, not buffered."""
    server, url = fake
    server.stream_body = sse(*([delta({"content": "x" * 1000})] * 200))
    async with aiohttp.ClientSession() as session:
        result = await chat(session, f"{url}/v1/chat/completions", {"stream": True}, 5, max_bytes=10_000)
    assert result.status is None and "larger than" in result.error


async def test_monitor_schedules_canary_after_first_200(fake: tuple[FakeServer, str]) -> None:
    """Health 200 starts the canary; the triage then opens the startup gate; the snapshot is JSON-ready."""
    server, url = fake
    settings = ProbeSettings(expected_tool_parser="kimi_k2", canary_timeout_s=5, health_timeout_s=5)
    monitor = Monitor(
        server="s",
        role="unified",
        base_url=url,
        model="m",
        settings=settings,
        tree=lambda: TreeView(rank_cpu_s={"TP0": 1.0}),
        gpu=None,
        log_lines=lambda: [],
        pids_for_stacks=dict,
    )
    loop = asyncio.get_running_loop()

    def triaged(phase: str) -> Triage:
        facts = ServerFacts("unified", phase, monitor.started_at, settings)
        return triage(monitor.window(), TreeFacts(), facts, loop.time())

    try:
        deadline = loop.time() + 10
        while loop.time() < deadline and not triaged("starting").serving:
            await monitor.tick(loop.time())
            await asyncio.sleep(0.02)
        assert triaged("starting").serving
        assert triaged("serving").fault is None
        snap = json.loads(json.dumps(monitor.snapshot()))
        assert {"health", "canary_tool", "config_check", "progress", "ranks", "logs"} <= set(snap["probes"])
        assert server.requests.count("/health") == 1
    finally:
        await monitor.aclose()


def _bare_monitor(url: str, settings: ProbeSettings) -> Monitor:
    """A monitor of the fake server with no tree, GPU or log readers."""
    return Monitor(
        server="s", role="unified", base_url=url, model="m", settings=settings,
        tree=TreeView, gpu=None, log_lines=list, pids_for_stacks=dict,
    )  # fmt: skip


async def _drive_fake_time(monitor: Monitor, ticks: int, step_s: float) -> None:
    """Tick the monitor with a synthetic clock `step_s` apart, letting its probe tasks finish between ticks."""
    now = asyncio.get_running_loop().time()
    for i in range(ticks):
        await monitor.tick(now + i * step_s)
        await asyncio.sleep(0.02)


async def test_stream_canary_period_zero_means_off(fake: tuple[FakeServer, str]) -> None:
    """Regression: `stream_canary_period_s = 0` ran the load canary back to back; now it never runs."""
    server, url = fake
    settings = ProbeSettings(
        expected_tool_parser="kimi_k2", canary_period_s=5, stream_canary_period_s=0,
        stream_canary_concurrency=4, canary_timeout_s=5, health_timeout_s=5,
    )  # fmt: skip
    monitor = _bare_monitor(url, settings)
    try:
        await _drive_fake_time(monitor, 40, 5.0)
        probes = monitor.snapshot()["probes"]
        assert probes["canary_tool"]["values"]["verdict"] == "pass"
        assert "canary_stream" not in probes
        assert server.requests.count("/v1/chat/completions") <= 2 * 41  # the tool canary's two, no more
    finally:
        await monitor.aclose()


async def test_canary_mode_off_sends_no_canary(fake: tuple[FakeServer, str]) -> None:
    """`canary_mode = "off"`: /health and /metrics only, never a chat completion."""
    server, url = fake
    settings = ProbeSettings(canary_mode="off", canary_period_s=5, health_timeout_s=5)
    monitor = _bare_monitor(url, settings)
    try:
        await _drive_fake_time(monitor, 20, 5.0)
        assert "/health" in server.requests
        assert "/v1/chat/completions" not in server.requests
    finally:
        await monitor.aclose()


@pytest.mark.unit
async def test_first_stream_canary_runs_soon_after_the_first_pass(fake: tuple[FakeServer, str]) -> None:
    """The load canary first runs `stream_canary_first_s` after the tool canary passed, not a period later."""
    _, url = fake
    settings = ProbeSettings(
        expected_tool_parser="kimi_k2", stream_canary_first_s=10, stream_canary_period_s=1800,
        stream_canary_concurrency=2, canary_timeout_s=5, health_timeout_s=5,
    )  # fmt: skip
    monitor = _bare_monitor(url, settings)
    try:
        loop = asyncio.get_running_loop()
        start, passed_at = loop.time(), None
        for i in range(
            200
        ):  # 2 s of synthetic time a tick, until the load canary ran (a loaded machine: later)
            await monitor.tick(start + i * 2.0)
            await asyncio.sleep(0.02)
            probes = monitor.snapshot()["probes"]
            if passed_at is None and probes.get("canary_tool", {}).get("values", {}).get("verdict") == "pass":
                passed_at = i * 2.0
            if "canary_stream" in probes:
                break
        assert passed_at is not None and probes["canary_stream"]["values"]["concurrency"] == 2
        assert (
            i * 2.0 - passed_at <= settings.stream_canary_first_s + 4.0
        )  # soon after the pass, not a period
    finally:
        await monitor.aclose()


@pytest.mark.unit
async def test_routine_local_readings_age_out_but_the_newest_stays() -> None:
    """Ranks readings that show nothing wrong leave the window after ROUTINE_KEEP_S; the newest is always in it."""
    monitor = Monitor(
        server="s", role="unified", base_url="http://127.0.0.1:9", model="m", settings=ProbeSettings(),
        tree=lambda: TreeView(rank_cpu_s={"TP0": 1.0}), gpu=None, log_lines=list, pids_for_stacks=dict,
    )  # fmt: skip
    try:
        start = asyncio.get_running_loop().time()
        for i in range(200):
            await monitor.tick(start + i)  # port 9 refuses: the HTTP probes fail fast
        ranks = [o for o in monitor.window() if o.probe == "ranks"]
        assert ranks and min(o.at for o in ranks) >= start + 199 - ROUTINE_KEEP_S
        assert max(o.at for o in ranks) == start + 199
    finally:
        await monitor.aclose()


@pytest.mark.unit
async def test_the_loop_sleeps_until_a_probe_is_due_or_one_in_flight_finishes(
    fake: tuple[FakeServer, str],
) -> None:
    """`next_due` skips a probe in flight (no busy wait on it); its end sets `ready`, and the next tick clears it."""
    server, url = fake
    server.health_delay = 0.5  # SGLang's /health takes a second: longer than its startup probe period here
    settings = ProbeSettings(health_period_s=0.2, metrics_period_s=5, health_timeout_s=5)
    monitor = _bare_monitor(url, settings)
    try:
        now = asyncio.get_running_loop().time()
        await monitor.tick(now)  # /health and the metrics scrape start
        await monitor.tick(now + 0.3)  # /health is due again but still in flight
        assert monitor.next_due() == now + 1.0, "the local readings, not the /health in flight"
        seen: set[str] = set()
        while "health" not in seen:  # each finished probe wakes the loop (the scrape first, then /health)
            await asyncio.wait_for(monitor.ready.wait(), 10)
            seen |= {o.probe for o in await monitor.tick(now + 0.6)}
            assert not monitor.ready.is_set(), "the tick took what woke it"
    finally:
        await monitor.aclose()


async def test_a_pd_workers_canary_waits_for_a_partner_and_then_goes_through_the_pair(
    fake: tuple[FakeServer, str],
) -> None:
    """A decode with no prefill up sends no canary (re-checked every PAIR_RETRY_S); once one is, the canary goes
    to the decode with the prefill's bootstrap endpoint and a room, and the same request to the prefill."""
    server, url = fake
    settings = ProbeSettings(expected_tool_parser="kimi_k2", canary_timeout_s=5, health_timeout_s=5)
    partner: list[PdPair] = []
    monitor = Monitor(
        server="d", role="decode", base_url=url, model="m", settings=settings, tree=TreeView, gpu=None,
        log_lines=list, pids_for_stacks=dict, pd_pair=lambda: partner[0] if partner else None,
    )  # fmt: skip
    try:
        await _drive_fake_time(monitor, 10, 1.0)
        assert "canary_tool" not in monitor.snapshot()["probes"]
        assert not any(path == "/v1/chat/completions" for path in server.requests)
        partner.append(PdPair(url, url, "127.0.0.1", 8998))
        await _drive_fake_time(monitor, 30, 1.0)  # the synthetic clock starts again from now
        assert monitor.snapshot()["probes"]["canary_tool"]["values"]["verdict"] == "pass"
        assert len(server.rooms) >= 4 and all(isinstance(room, int) for room in server.rooms)
        assert len(server.rooms) == 2 * len(set(server.rooms))  # each room sent to both sides
    finally:
        await monitor.aclose()


async def test_a_pd_workers_live_queues_say_what_waits_for_the_partner(fake: tuple[FakeServer, str]) -> None:
    """`/v1/loads` per DP rank: a decode's transfer queue waits for a prefill's KV, its pre-allocation queue is its
    own step; a prefill's bootstrap queue waits for a decode."""
    server, url = fake
    queues = {"decode_prealloc_queue_reqs": 3, "decode_transfer_queue_reqs": 1}
    queues |= {"prefill_bootstrap_queue_reqs": 2, "prefill_inflight_queue_reqs": 0}
    server.loads = [{"num_running_reqs": 1, "disaggregation": queues}, {"num_running_reqs": 0}]
    async with aiohttp.ClientSession() as session:
        ranks = await read_loads(session, url, 5.0, None)
    assert pd_summary(ranks, "decode") == PdLoads(4.0, 1.0, 1.0)
    assert pd_summary(ranks, "prefill") == PdLoads(2.0, 1.0, 2.0)
    assert pd_summary(ranks, "unified") is None


async def test_aborting_a_servers_requests_asks_sglang_to_abort_all(fake: tuple[FakeServer, str]) -> None:
    """`POST /abort_request {"abort_all": true}`: '' when taken; a refused or unreachable server says why."""
    server, url = fake
    assert await abort_all(url, None, 5.0) == "" and server.aborts == [{"abort_all": True}]
    assert (await abort_all(f"{url}/nowhere", None, 5.0)).startswith("HTTP 404")
    assert await abort_all("http://127.0.0.1:1", None, 5.0) != ""


def test_an_abort_restarts_the_pd_stand_and_a_shorter_queue_ends_it() -> None:
    """After the supervisor aborted a blocked decode's requests the stand counts from the abort (`pd_aborts`
    counts the aborts that freed nothing); a shorter queue or a request's token means the abort freed it: what
    stands after is a new stand."""
    p = ProgressTracker("decode")
    p.reset(0.0)
    busy = parse_metrics('sglang:http_requests_active{endpoint="/generate",method="POST"} 2\n')
    assert p.update(busy, 1.0, pd_live=PdLoads(5.0, 0.0)).values["pd_stalled_s"] == 0.0
    assert p.update(busy, 31.0, pd_live=PdLoads(5.0, 0.0)).values["pd_stalled_s"] == 30.0
    p.restart_pd(31.0)
    same = p.update(busy, 41.0, pd_live=PdLoads(6.0, 0.0)).values
    assert same["pd_stalled_s"] == 10.0 and same["pd_aborts"] == 1
    new = p.update(busy, 42.0, pd_live=PdLoads(2.0, 0.0)).values
    assert new["pd_stalled_s"] == 0.0 and new["pd_aborts"] == 0
    assert p.update(busy, 52.0, pd_live=PdLoads(4.0, 0.0)).values["pd_stalled_s"] == 10.0
    p.restart_pd(52.0)
    p.restart_pd(53.0)
    assert p.update(busy, 53.0, pd_live=PdLoads(4.0, 0.0)).values["pd_aborts"] == 2
    served = parse_metrics(
        'sglang:http_requests_active{endpoint="/generate",method="POST"} 2\nsglang:generation_tokens_total 9\n'
    )
    after = p.update(served, 54.0, pd_live=PdLoads(4.0, 0.0)).values  # a request's token: the abort freed it
    assert after["pd_aborts"] == 0 and after["pd_stalled_s"] == 0.0
