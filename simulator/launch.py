"""One launch of the simulated server: spawn the ranks, wait for them to load, publish the stand-in GPUs.

Serving it is `simulator.lifecycle`, a multi-node group `simulator.multinode`, ending it `simulator.teardown`.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import random
import threading
import time
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any, NoReturn

from simulator import gpus
from simulator.cli import SimServerArgs
from simulator.dp import DpEngines
from simulator.engine import Engine
from simulator.families import detect_family
from simulator.faults import FaultBook
from simulator.logs import log, rank_prefix, scheduler_title
from simulator.procs import kill_tree, shm_used_mb
from simulator.ranks import RankSpec, detokenizer_main, dp_controller_main, scheduler_main
from simulator.server import IDENTITY, SimState
from simulator.sim_metrics import SimMetrics


def dp_groups(args: SimServerArgs) -> tuple[int, int]:
    """(DP ranks, scheduler processes of each on this node). With `--enable-dp-attention` the DP ranks split the TP
    group (`--tp-size` processes in all, `scheduler_DP1_TP1` …); without it each DP rank has a TP group of its own."""
    dp, (tp, _) = max(1, args.dp_size), local_tp(args)
    if args.enable_dp_attention:
        return dp, max(1, tp // dp)
    return dp, tp


def local_tp(args: SimServerArgs) -> tuple[int, int]:
    """(ranks of the TP group on this node, global TP rank of its first one)."""
    nnodes = max(1, args.nnodes)
    per_node = max(1, max(1, args.tp_size) // nnodes)
    return per_node, args.node_rank * per_node


class Launch:
    """One launch of the simulated server."""

    def __init__(self, args: SimServerArgs) -> None:
        self.args = args
        self.faults = FaultBook(tuple(args.argv))
        self.ctx = mp.get_context("spawn")
        self.children: list[tuple[str, BaseProcess]] = []
        self.conns: list[Connection] = []
        self.groups: list[Any] = []
        self.leaders: list[Connection] = []
        self.rank_pids: dict[int, int] = {}  # physical GPU -> pid
        self.load_fraction = 0.0
        self.ready = False
        self.xid_sent = False
        self.engine: DpEngines | None = None
        self.state = SimState()
        self.metrics = SimMetrics(
            args.served_name,
            _engine_type(args),
            not _cuda_graph_disabled(args),
            dp_rank=0 if args.dp_size > 1 else None,
        )
        self.rng = random.Random(int(os.environ.get("SGLANG_SIM_SEED", "0") or 0))
        self.marker = gpus.state_dir() / "ports" / f"{args.port}.running"
        groups, per_group = dp_groups(args)
        self.gpus = [self._gpu_of(i) for i in range(groups * per_group)]

    def _gpu_of(self, rank: int) -> int:
        return gpus.physical_gpu(self.args.base_gpu_id + rank * max(1, getattr(self.args, "gpu_id_step", 1)))

    def startup_s(self) -> float:
        """The load duration: SGLANG_SIM_STARTUP_S, or a DeepGEMM JIT session for slow_startup_deepgemm."""
        fault = self.faults.get("slow_startup_deepgemm")
        if fault is not None:
            return float(fault.params.get("startup_s", 720))
        return float(os.environ.get("SGLANG_SIM_STARTUP_S", "0.8"))

    def spawn(self) -> None:
        """Start the detokenizer and the schedulers (under a DP controller when dp > 1)."""
        args = self.args
        detach = self.faults.get("orphans_hold_gpu_and_ports") is not None
        quota = float(os.environ.get("SGLANG_SIM_SHM_QUOTA_MB", "64"))
        startup_crash = "sigbus" if shm_used_mb() > quota else ""
        env = tuple((k, v) for k, v in os.environ.items() if k.startswith(("SGLSUP_", "SGLANG_")))
        step_s = float(os.environ.get("SGLANG_SIM_STEP_S", "0.01"))
        mem = float(args.mem_fraction_static or 0.88)
        family = detect_family(args.model_path, os.environ.get("SGLANG_SIM_MODEL_FAMILY") or None)
        jobs: list[tuple[RankSpec, Connection, Any]] = []
        attention = bool(args.enable_dp_attention)
        (dp, tp), first = dp_groups(args), local_tp(args)[1]
        for d in range(dp):
            group = (self.ctx.Barrier(tp), self.ctx.Barrier(tp))
            self.groups.append(group)  # Process.start() drops its args: keep the semaphores alive
            for t in range(tp):
                dp_rank = d if dp > 1 else None
                shown = first + t + (d * tp if attention else 0)  # the TP rank its title shows
                spec = RankSpec(
                    title=scheduler_title(dp_rank, shown, max(1, args.tp_size)),
                    prefix=rank_prefix(dp_rank, shown, max(1, args.tp_size)),
                    tp_rank=t,
                    tp_size=tp,
                    dp_rank=dp_rank,
                    gpu_local=args.base_gpu_id + (d * tp + t) * max(1, getattr(args, "gpu_id_step", 1)),
                    startup_s=self.startup_s(),
                    step_s=step_s,
                    mem_fraction=mem,
                    rpc_port=args.port + 2 + d,
                    architecture=IDENTITY[family][1],
                    detach=detach,
                    startup_crash=startup_crash,
                    env=env,
                )
                parent, child = self.ctx.Pipe()
                self.conns.append(parent)
                if t == 0:
                    self.leaders.append(parent)
                jobs.append((spec, child, group))
        if args.node_rank == 0:  # nodes ≥ 1 run schedulers only
            det_parent, det_child = self.ctx.Pipe()
            detok = self.ctx.Process(target=detokenizer_main, args=(det_child,), name="detokenizer")
            detok.start()
            self.children.append(("detokenizer", detok))
            self.detok_conn = det_parent
        if dp > 1:
            controller = self.ctx.Process(
                target=dp_controller_main, args=(jobs,), name="data_parallel_controller"
            )
            controller.start()
            self.children.append(("data_parallel_controller", controller))
        else:
            for i, job in enumerate(jobs):
                proc = self.ctx.Process(target=scheduler_main, args=job, name=f"scheduler_{i}")
                proc.start()
                self.children.append((f"scheduler_{i}", proc))
        if self.faults.get("slow_startup_deepgemm") is not None:
            threading.Thread(target=self._jit_progress, daemon=True).start()

    def _jit_progress(self) -> None:
        log(
            "Entering DeepGEMM JIT Pre-Compile session. It may take a long time (typically 10-20 mins) if you have not run `sglang.compile_deep_gemm`.",
            "TP0",
        )
        total = self.startup_s()
        start = time.monotonic()
        while not self.ready and time.monotonic() - start < total:
            pct = int(100 * (time.monotonic() - start) / total)
            log(f"DeepGEMM JIT Compiling for <gemm_fp8_fp8_bf16_nt> M=[1..4096] N=7168 K=2048: {pct}%", "TP0")
            time.sleep(min(5.0, max(0.2, total / 20)))

    def wait_ready(self) -> None:
        """Poll the ranks' pipes for the ready handshake; a rank that dies first ends the launch."""
        pending = set(range(len(self.conns)))
        while pending:
            for i in list(pending):
                conn = self.conns[i]
                try:
                    while conn.poll(0):
                        msg = conn.recv()
                        if msg.get("op") == "progress" and i == 0:
                            self.load_fraction = float(msg["fraction"])
                        elif msg.get("op") == "ready":
                            self.rank_pids[self._gpu_of(i)] = int(msg["pid"])
                            pending.discard(i)
                except (EOFError, OSError):
                    self._init_death(i, self._exit_code(i))
            for name, proc in self.children:
                if proc.exitcode is not None:
                    index = int(name.split("_")[1]) if name.startswith("scheduler_") else 0
                    self._init_death(index, proc.exitcode)
            time.sleep(0.02)
        self.ready = True
        self.load_fraction = 1.0

    def _exit_code(self, rank: int) -> int | None:
        """The exit code of a rank whose pipe broke (waiting briefly for the process to be reaped)."""
        proc = dict(self.children).get(f"scheduler_{rank}")
        if proc is not None:
            proc.join(5)
            return proc.exitcode
        return None

    def _init_death(self, rank: int, code: int | None = None) -> NoReturn:
        log(
            f"Rank {rank} scheduler died during initialization (exit code: {code}). If exit code is -9 (SIGKILL), a "
            "common cause is the OS OOM killer. Run `dmesg -T | grep -i oom` to check."
        )
        kill_tree(include_parent=False, exit_code=1)

    def publish_gpus(self) -> None:
        """Update nvml.json once a second with figures for what each DP rank's ranks are doing."""
        while True:
            group = self.engine
            samples = []
            per_rank = max(1, len(self.gpus) // max(1, self.args.dp_size))
            for k, gpu in enumerate(self.gpus):
                engine = group.engines[min(k // per_rank, len(group.engines) - 1)] if group else None
                phase = self._phase(engine)
                if engine is not None and engine.desynced and k % per_rank == per_rank - 1:
                    phase = "idle"  # the rank ahead waits in its all-reduce, idle on its GPU
                pids = [self.rank_pids[gpu]] if gpu in self.rank_pids else []
                load = gpus.GpuLoad(
                    phase, self.load_fraction, float(self.args.mem_fraction_static or 0.88), pids
                )
                samples.append(gpus.sample(gpu, load, self.rng))
            with contextlib.suppress(OSError):
                gpus.publish(samples, self._new_xids())
            time.sleep(1.0 if self.ready else 0.2)

    def _phase(self, engine: Engine | None) -> str:
        if not self.ready:
            return "loading"
        if engine is not None and (engine.wedged or engine.step_overdue(time.monotonic())):
            return "spin"  # the ranks that still run wait in a collective for one that does not
        if engine is not None and engine.running and not engine.paused:
            return "busy"  # a paused engine runs no kernel
        return "idle"

    def _new_xids(self) -> dict[int, list[dict[str, Any]]]:
        """An illegal memory access leaves its Xid (param `xid`, 13 by default) on the first GPU (once)."""
        fault = self.faults.fired("illegal_memory_access")
        if self.xid_sent or fault is None:
            return {}
        self.xid_sent = True
        return {self.gpus[0]: [{"xid": int(fault.params.get("xid", 13)), "at": time.time()}]}

    def publish_stopped(self) -> None:
        """The ranks are gone: their GPUs are free (and any Xid of the crash is on record)."""
        load = gpus.GpuLoad("stopped", 0.0, 0.0, [])
        with contextlib.suppress(OSError):
            gpus.publish([gpus.sample(g, load, self.rng) for g in self.gpus], self._new_xids())


def _engine_type(args: SimServerArgs) -> str:
    mode = str(args.disaggregation_mode or "null")
    return mode if mode in ("prefill", "decode") else "unified"


def _cuda_graph_disabled(args: SimServerArgs) -> bool:
    return bool(args.disable_cuda_graph) or args.cuda_graph_backend_decode == "disabled"
