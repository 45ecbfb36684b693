"""The child processes: schedulers (one per rank), the detokenizer and the data-parallel controller.

Ranks of one TP group coordinate through two barriers standing in for NCCL collectives, so a stack dump shows
meaningful frames: an idle rank waits in `recv_requests`, a working one passes through `broadcast`, `forward`
and `all_reduce`; a desynchronised group blocks some ranks in `broadcast` and others in `all_reduce`; a spinning
custom all-reduce loops in `custom_all_reduce`.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.synchronize import Barrier
from typing import Any

from setproctitle import setproctitle

from simulator import gpus
from simulator.logs import log

PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class RankSpec:
    """Everything a scheduler process needs, picklable for the spawn start method."""

    title: str
    prefix: str
    tp_rank: int
    tp_size: int
    dp_rank: int | None
    gpu_local: int
    startup_s: float
    step_s: float
    mem_fraction: float
    rpc_port: int
    architecture: str
    detach: bool  # orphans_hold_gpu_and_ports: setsid and no parent-death signal
    startup_crash: str  # "" | "sigbus" | "port_in_use"
    env: tuple[tuple[str, str], ...]


def kill_itself_when_parent_died() -> None:
    """Ask the kernel for SIGKILL when the creating thread's process dies (as SGLang's children do)."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def recv_requests(conn: Connection) -> Any:
    """Block until the main process sends the next batch."""
    return conn.recv()


def broadcast(group: tuple[Barrier, Barrier]) -> None:
    """The request broadcast collective of the TP group."""
    group[0].wait()


def all_reduce(group: tuple[Barrier, Barrier]) -> None:
    """The all-reduce at the end of a forward."""
    group[1].wait()


def custom_all_reduce() -> None:
    """A Lamport-style custom all-reduce polling a flag that never flips: spins forever."""
    flag = 0
    while flag == 0:
        time.sleep(0.005)


def tree_speculative_sampling_target_only() -> None:
    """The speculative-decoding verify kernel of #35822, spinning on the GPU forever."""
    accepted = 0
    while accepted == 0:
        time.sleep(0.005)


def forward(step_s: float) -> int:
    """One forward pass: a little real arithmetic, then the rest of the step time."""
    acc = 0
    for i in range(2000):
        acc = (acc * 31 + i) % 1000003
    time.sleep(step_s)
    return acc


def run_batch(spec: RankSpec, group: tuple[Barrier, Barrier], batch: dict[str, Any]) -> None:
    """Execute one step as this rank, or fail the way the armed fault says."""
    mode = batch.get("mode", "")
    if mode == "desync":
        if spec.tp_rank in batch.get("ahead", ()):
            all_reduce(group)
        else:
            broadcast(group)
    if mode == "spin":
        if batch.get("ignore_sigterm"):
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if batch.get("kernel") == "spec":
            tree_speculative_sampling_target_only()
        custom_all_reduce()
    if mode in ("oom", "ima", "abort") and spec.tp_rank == 0:
        crash(spec, mode)
    broadcast(group)
    forward(float(batch.get("step_s", spec.step_s)))
    all_reduce(group)


def crash(spec: RankSpec, mode: str) -> None:
    """Die as a scheduler does on CUDA OOM, an illegal memory access, or a C++ abort."""
    if mode == "oom":
        log(
            "Scheduler hit an exception: Traceback (most recent call last):\n"
            '  File "/sgl-workspace/sglang/python/sglang/srt/managers/scheduler.py", line 2911, in run_scheduler_process\n'
            "    scheduler.event_loop_overlap()\n"
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 616.00 MiB. GPU 0 has a total capacity of "
            "139.81 GiB of which 212.19 MiB is free.",
            spec.prefix,
        )
        os.kill(os.getppid(), signal.SIGQUIT)
        sys.exit(1)
    if mode == "ima":
        log("CUDA error: an illegal memory access was encountered", spec.prefix)
        log("[PG ID 2 PG GUID 3 Rank 0] Process group watchdog thread terminated with exception", spec.prefix)
        sys.stderr.write("Fatal Python error: Aborted\n")
        sys.stderr.flush()
    os.abort()


def scheduler_main(spec: RankSpec, conn: Connection, group: tuple[Barrier, Barrier]) -> None:
    """The scheduler process: title, GPU, port, model load, ready handshake, then the event loop."""
    setproctitle(spec.title)
    os.environ.update(dict(spec.env))
    if spec.detach:
        with contextlib.suppress(OSError):
            os.setsid()
    else:
        kill_itself_when_parent_died()
    gpu = gpus.physical_gpu(spec.gpu_local)
    device = open(gpus.ensure_device(gpu), "rb")  # noqa: SIM115 - held for the life of the rank, like a CUDA context
    held: list[socket.socket] = []
    if spec.tp_rank == 0:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.bind(("127.0.0.1", spec.rpc_port))
            sock.listen(8)
            held.append(sock)
        except OSError:
            log(
                f"zmq.error.ZMQError: Address already in use (addr='tcp://127.0.0.1:{spec.rpc_port}')",
                spec.prefix,
            )
            sys.exit(1)
    if spec.startup_crash == "sigbus" and spec.tp_rank == 0:
        time.sleep(min(spec.startup_s, 0.3))
        sys.stderr.write("Fatal Python error: Bus error\n")
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGBUS)
    load_model(spec, conn)
    event_loop(spec, conn, group)
    device.close()


def load_model(spec: RankSpec, conn: Connection) -> None:
    """Model load with SGLang's log lines and progress, then the ready handshake."""
    p = spec.prefix
    t0 = time.monotonic()
    if spec.tp_rank == 0:
        log("Init parallel begin.", p)  # SGLang 0.5.23's wording (older releases: "Init torch distributed")
        log(f"Init parallel ends. elapsed={time.monotonic() - t0:.2f} s", p)
        log("Load weight begin. avail mem=138.42 GB", p)
    shards = 8
    for i in range(1, shards + 1):
        conn.send({"op": "progress", "phase": "load", "fraction": i / shards})
        time.sleep(spec.startup_s * 0.6 / shards)
        if spec.tp_rank == 0:
            pct = int(100 * i / shards)
            log(
                f"Loading safetensors checkpoint shards: {pct:3d}% Completed | {i}/{shards} [00:0{i}<00:00]",
                p,
            )
    if spec.tp_rank == 0:
        log(
            f"Load weight end. elapsed=4.21 s, type={spec.architecture}, avail mem=62.31 GB, mem usage=76.11 GB.",
            p,
        )
        log("KV Cache is allocated. dtype: torch.bfloat16, #tokens: 1048576, KV size: 58.21 GB", p)
        log("Memory pool end. avail mem=4.10 GB", p)
        log(
            "Capture target decode CUDA graph begin. backend=full, num_tokens_per_req=1, bs=[1, 2, 4, 8], avail mem=4.10 GB",
            p,
        )
    time.sleep(spec.startup_s * 0.3)
    if spec.tp_rank == 0:
        log("Capture target decode CUDA graph end. elapsed=1.02 s, mem usage=0.41 GB, avail mem=3.69 GB.", p)
        log(
            "max_total_num_tokens=1048576, chunked_prefill_size=8192, max_prefill_tokens=16384, "
            "max_running_requests=512, context_len=131072, available_gpu_mem=3.69 GB",
            p,
        )
    conn.send(
        {"op": "ready", "pid": os.getpid(), "max_total_num_tokens": 1048576, "max_req_input_len": 131066}
    )


def _record_scheduler_state_for_paused_engine(conn: Connection) -> dict[str, Any]:
    """SGLang's paused event loop (`retract`, `in_place`): spin on the intake until told to continue; the stack
    names this function, as a paused scheduler's does. Returns the message that ended the pause."""
    while True:
        if conn.poll(0.05):
            message: dict[str, Any] = conn.recv()
            if message.get("op") in ("continue", "shutdown"):
                return message


def event_loop(spec: RankSpec, conn: Connection, group: tuple[Barrier, Barrier]) -> None:
    """Receive batches and run them; rank 0 reports each finished step."""
    while True:
        try:
            batch = recv_requests(conn)
            if batch.get("op") == "pause":
                batch = _record_scheduler_state_for_paused_engine(conn)
        except (EOFError, OSError):
            threading.Event().wait()  # the parent is gone: like a ZMQ recv, wait forever (PDEATHSIG ends us)
        op = batch.get("op")
        if op == "shutdown":
            return
        if op == "step":
            run_batch(spec, group, batch)
            if spec.tp_rank == 0:
                try:
                    conn.send({"op": "done", "step": batch["step"]})
                except OSError:
                    threading.Event().wait()  # the parent died mid-step: same as a dead ZMQ peer


def detokenizer_main(conn: Connection) -> None:
    """The detokenizer: idle in its loop until shutdown (tokens are decoded in the main process here)."""
    setproctitle("sglang::detokenizer")
    kill_itself_when_parent_died()
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg.get("op") == "shutdown":
            return


def dp_controller_main(jobs: list[tuple[RankSpec, Connection, tuple[Barrier, Barrier]]]) -> None:
    """The data-parallel controller: starts the schedulers of every DP rank and keeps its threads alive."""
    import multiprocessing as mp

    setproctitle("sglang::data_parallel_controller")
    kill_itself_when_parent_died()
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=scheduler_main, args=job) for job in jobs]
    for p in procs:
        p.start()
    while all(p.is_alive() for p in procs):
        time.sleep(0.5)
    for p in procs:
        if p.exitcode not in (None, 0):
            log(f"DataParallelController hit an exception: scheduler exited with code {p.exitcode}")
            os.kill(os.getppid(), signal.SIGQUIT)
            sys.exit(1)
