"""The main process: launch (`simulator.launch`), serve, warm up and declare the server ready.

Shutting down and crashing (SIGTERM drain, SIGQUIT teardown, the subprocess watchdog) are in `simulator.teardown`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import threading
from types import FrameType
from typing import Any, NoReturn

import aiohttp
from aiohttp import web

from simulator.cli import SimServerArgs
from simulator.dp import DpEngines
from simulator.engine import Engine
from simulator.faults import ScenarioError, flag_present
from simulator.launch import Launch
from simulator.logs import log, uvicorn
from simulator.multinode import Hub, rendezvous, serve_worker
from simulator.procs import kill_tree
from simulator.server import SimServer
from simulator.teardown import Crash


def run(args: SimServerArgs) -> NoReturn:
    """Launch, load, serve until a signal or a crash ends the process."""
    log(f"server_args={args.server_info()!r}")
    launch = Launch(args)
    try:
        launch.faults.arm_launch(os.environ.get("SGLANG_SIM_SCENARIO", ""))
    except ScenarioError as exc:
        log(f"Invalid simulator scenario: {exc}")
        sys.exit(1)
    launch.state.launch_dirty = launch.marker.exists()
    launch.marker.parent.mkdir(parents=True, exist_ok=True)
    launch.marker.write_text(str(os.getpid()))
    signal.signal(signal.SIGQUIT, _launch_sigquit)
    launch.spawn()
    threading.Thread(target=launch.publish_gpus, daemon=True).start()
    launch.wait_ready()
    link = rendezvous(launch) if args.nnodes > 1 else None
    if link is not None and not isinstance(link, Hub):
        asyncio.run(serve_worker(launch, link))
    else:
        asyncio.run(serve(launch, link))
    sys.exit(0)


def _launch_sigquit(signum: int, frame: FrameType | None) -> None:
    log("Received sigquit from a child process. It usually means the child failed.")
    kill_tree(include_parent=True)


async def serve(launch: Launch, hub: Hub | None = None) -> None:
    """Run the HTTP server(s), warmup, the subprocess watchdog and the signal handlers."""
    args = launch.args
    loop = asyncio.get_running_loop()
    dp = max(1, args.dp_size)
    per_rank = len(launch.conns) // dp
    engines = [
        Engine(
            launch.conns[d * per_rank : (d + 1) * per_rank],
            [launch.leaders[d]],
            launch.faults,
            launch.metrics if d == 0 else launch.metrics.rank(d),
            tp_size=per_rank if args.enable_dp_attention else max(1, args.tp_size),
            step_s=float(os.environ.get("SGLANG_SIM_STEP_S", "0.01")),
            overlap=not args.disable_overlap_schedule,
            speculative=bool(args.speculative_algorithm),
            watchdog_timeout=float(args.watchdog_timeout),
            watchdog_label=str(args.watchdog_timeout)
            if flag_present(args.argv, "--watchdog-timeout")
            else f"{args.watchdog_timeout:g}",
            decode_log_interval=int(args.decode_log_interval),
            rank_pids=[launch.rank_pids[g] for g in launch.gpus[d * per_rank : (d + 1) * per_rank]],
            cross_node=hub.collective if hub else None,
            dp_rank=d if dp > 1 else None,
            dp_size=dp,
            dp_attention=bool(args.enable_dp_attention),
        )
        for d in range(dp)
    ]
    engine = DpEngines(engines)
    launch.engine = engine
    engine.start()
    crash = Crash(launch)
    server = SimServer(args, engine, launch.metrics, launch.faults, launch.state, crash.fatal)
    runner = web.AppRunner(server.app(), access_log=None, handle_signals=False)
    await runner.setup()
    try:
        await web.TCPSite(runner, args.host, args.port, reuse_address=True).start()
        if server.pd.mode == "prefill":
            boot = web.AppRunner(server.pd.bootstrap_app(), access_log=None, handle_signals=False)
            await boot.setup()
            await web.TCPSite(boot, args.host, args.disaggregation_bootstrap_port, reuse_address=True).start()
    except OSError as exc:
        log(
            f"ERROR:    [Errno {exc.errno}] error while attempting to bind on address ('{args.host}', {args.port}): {exc.strerror}"
        )
        kill_tree(include_parent=False, exit_code=1)
    uvicorn(f"Started server process [{os.getpid()}]")
    uvicorn("Waiting for application startup.")
    uvicorn("Application startup complete.")
    uvicorn(f"Uvicorn running on {args.listen_url()} (Press CTRL+C to quit)")
    loop.add_signal_handler(signal.SIGTERM, crash.sigterm)
    loop.add_signal_handler(signal.SIGQUIT, crash.sigquit)
    tasks = [asyncio.create_task(warmup(launch, server)), asyncio.create_task(crash.subprocess_watchdog())]
    if server.pd.mode == "decode":
        tasks.append(asyncio.create_task(server.pd.heartbeat()))
    await asyncio.Event().wait()
    del tasks


async def warmup(launch: Launch, server: SimServer) -> None:
    """SGLang's warmup thread: wait for /model_info, send one generate, then declare the server ready."""
    args = launch.args
    base = args.url()
    if getattr(args, "skip_server_warmup", False):
        launch.state.status = "Up"
        log("The server is fired up and ready to roll!")
        return
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}  # as SGLang's warmup does
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600), headers=headers) as session:
        for _ in range(120):
            with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError):
                async with session.get(f"{base}/model_info", timeout=aiohttp.ClientTimeout(total=5)) as resp:
                    if resp.status == 200:
                        break
            await asyncio.sleep(1)
        await asyncio.sleep(float(os.environ.get("SGLANG_SIM_WARMUP_S", "0")))  # a slow first forward
        body: dict[str, Any] = {
            "text": "The capital city of France is",
            "sampling_params": {"temperature": 0, "max_new_tokens": 8},
        }
        if server.pd.mode != "null":
            log("Start of pd disaggregation warmup ...")
            body = {
                "input_ids": [10, 11, 12, 13],
                "sampling_params": {"max_new_tokens": 8, "ignore_eos": True},
                "bootstrap_host": "2.2.2.2",
                "bootstrap_room": 0,
            }
        try:
            async with session.post(f"{base}/generate", json=body) as resp:
                ok = resp.status == 200
                await resp.read()
        except (TimeoutError, aiohttp.ClientError) as exc:
            log(f"Initialization failed. warmup error: {exc!r}")
            kill_tree(include_parent=False, exit_code=1)
    if server.pd.mode != "null":
        log(
            "Disaggregation warmup requests completed for all 1 DP ranks"
            if ok
            else "Disaggregation warmup failed (mode=decode), status codes: [500]"
        )
        log("End of disaggregation warmup")
    launch.state.status = "Up"
    log("The server is fired up and ready to roll!")
