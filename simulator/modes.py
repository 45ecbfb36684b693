"""What a step of one engine runs into: the armed fault whose trigger holds now (if any), and the step's length.

The faults themselves act where SGLang would show them: a desync or a spin in the ranks (`simulator.ranks`), a
crash in a rank, a long prefill chunk, a slow DP rank, a brownout (a slow step, the batch pinned at its size).
"""

from __future__ import annotations

import time
from typing import Protocol

from simulator.faults import FaultBook
from simulator.request import Req


class Stepping(Protocol):
    """What a step's mode is chosen from: the engine's faults, layout and step, and what it records."""

    faults: FaultBook
    tp_size: int
    step_s: float
    overlap: bool
    speculative: bool
    long_prefill_until: float
    capacity: int | None
    dp_rank: int | None
    dp_size: int
    dp_attention: bool


def choose_mode(engine: Stepping, running: list[Req]) -> tuple[str, float]:
    """The fault (if any) this step runs into, and the step duration."""
    concurrency = len([r for r in running if r.kind == "user"])
    longest = max((len(r.tokens) for r in running), default=0)
    prompt = max((r.prompt_tokens for r in running if r.kind == "user"), default=0)
    user = concurrency > 0
    f = engine.faults
    if user and engine.tp_size >= 2 and engine.overlap and f.check("overlap_tp_desync_hang"):
        return "desync:overlap_tp_desync_hang", engine.step_s
    if user and engine.tp_size >= 2 and f.check("watchdog_disabled_silent_wedge"):
        return "desync:watchdog_disabled_silent_wedge", engine.step_s
    if user and _mine(engine, "dp_rank_wedge") and f.check("dp_rank_wedge"):
        return "spin:dp_rank_wedge", engine.step_s
    if user and _mine(engine, "dp_rank_slow") and f.check("dp_rank_slow"):
        fault = f.get("dp_rank_slow")
        return "", engine.step_s * float(fault.params.get("factor", 50) if fault else 50)
    if user and f.check("brownout"):
        fault = f.get("brownout")
        if engine.capacity is None:  # the batch is pinned at `batch` requests: the queue grows behind it
            engine.capacity = int(fault.params.get("batch", 2) if fault else 2)
        return "", engine.step_s * float(fault.params.get("factor", 20) if fault else 20)
    if user and f.check("custom_allreduce_spin_sigterm_immune"):
        return "spin:custom_allreduce_spin_sigterm_immune", engine.step_s
    if user and engine.speculative and f.check("spec_decode_kernel_spin", max_tokens=longest):
        return "spin:spec_decode_kernel_spin", engine.step_s
    if user and f.check("dev_shm_crashloop"):
        return "oom", engine.step_s
    if user and f.check("runtime_cuda_oom_crash", concurrency=concurrency, prompt_tokens=prompt):
        return "oom", engine.step_s
    if user and engine.overlap and f.check("illegal_memory_access", concurrency=concurrency):
        return ("ima" if _ima_due(engine) else ""), engine.step_s
    if user and f.check("zombie_after_cpp_abort"):
        return "abort", engine.step_s
    if user and f.check("health_false_negative_long_prefill", prompt_tokens=prompt):
        fault = f.get("health_false_negative_long_prefill")
        duration = float(fault.params.get("duration_s", 60)) if fault else 60.0
        if engine.long_prefill_until == 0.0:
            engine.long_prefill_until = time.monotonic() + duration
        if time.monotonic() < engine.long_prefill_until:
            return "", float(fault.params.get("chunk_s", 25)) if fault else 25.0
    return "", engine.step_s


def _mine(engine: Stepping, name: str) -> bool:
    """A fault of one DP rank (param `dp_rank`, the last rank by default) is this engine's; with DP attention a
    rank's fault, once fired, holds every rank at its next step."""
    fault = engine.faults.get(name)
    if fault is None or engine.dp_rank is None:
        return False
    if engine.dp_attention and fault.fired_at is not None:
        return True
    return int(fault.params.get("dp_rank", engine.dp_size - 1)) == engine.dp_rank


def _ima_due(engine: Stepping) -> bool:
    """The rank aborts `crash_after_s` after the fault fired (0: at once); until then the GPU's Xid is on record
    while the ranks still run, as when a card falls off the bus and the next CUDA call fails."""
    fault = engine.faults.fired("illegal_memory_access")
    if fault is None or fault.fired_at is None:
        return True
    return time.time() >= fault.fired_at + float(fault.params.get("crash_after_s", 0))
