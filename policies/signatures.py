"""The log-line catalog: SGLang's fatal, warning and progress lines, each mapped to what it means.

Strings come from `reference/failure-modes.md` §0.5 and `reference/sglang-internals.md` §6. The whole catalog
is compiled once into one alternation of named groups, so a line costs one `search`; a cheap keyword
pre-filter skips the many lines (access logs, request dumps) that cannot match anything.

`kind` is a fault kind of docs/contracts.md for fatal lines, or one of the non-fault classes:
`ready` (startup complete), `startup_progress` (a loading phase moved), `prefill_progress` and
`decode_progress` (the scheduler produced a batch), `warning` (noted as evidence, never decisive alone).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

READY = "ready"
STARTUP_PROGRESS = "startup_progress"
PREFILL_PROGRESS = "prefill_progress"
DECODE_PROGRESS = "decode_progress"
WARNING = "warning"


@dataclass(frozen=True)
class Signature:
    """One catalogued line: `pattern` is a regex searched anywhere in the line."""

    name: str
    pattern: str
    kind: str
    tag: str = ""  # evidence tag for ladders (`crash:illegal_memory_access`)

    @property
    def fatal(self) -> bool:
        """True for lines that name a fault kind."""
        return self.kind not in (READY, STARTUP_PROGRESS, PREFILL_PROGRESS, DECODE_PROGRESS, WARNING)


@dataclass(frozen=True)
class Hit:
    """A catalogued line seen in the log."""

    signature: Signature
    line: str


def _s(name: str, pattern: str, kind: str, tag: str = "") -> Signature:
    return Signature(name, pattern, kind, tag)


CATALOG: tuple[Signature, ...] = (
    # readiness and startup progress (P6: a slow start that logs progress is alive)
    _s("ready", r"The server is fired up and ready to roll!", READY),
    _s("init_dist", r"Init torch distributed (?:begin|ends)", STARTUP_PROGRESS),
    _s("nccl_warmup", r"(?:NCCL|RCCL|HCCL)/?\S* warmup completed", STARTUP_PROGRESS),
    _s("load_weight", r"Load weight (?:begin|end)", STARTUP_PROGRESS),
    _s("shards", r"Loading \S+ checkpoint shards:\s+\d+%", STARTUP_PROGRESS),
    _s("kv_alloc", r"KV Cache is allocated", STARTUP_PROGRESS),
    _s("mem_pool", r"Memory pool end", STARTUP_PROGRESS),
    _s("graph_capture", r"Capture (?:\w+ )*?(?i:cuda) graph (?:begin|end)", STARTUP_PROGRESS),
    _s("deepgemm_enter", r"Entering DeepGEMM JIT", STARTUP_PROGRESS),
    _s("deepgemm_progress", r"DeepGEMM JIT \w+", STARTUP_PROGRESS),
    _s("max_tokens", r"max_total_num_tokens=\d+", STARTUP_PROGRESS),
    _s(
        "uvicorn", r"Uvicorn running on|Application startup complete|Started server process", STARTUP_PROGRESS
    ),
    _s("pd_warmup", r"(?:Start|End) of (?:pd )?disaggregation warmup", STARTUP_PROGRESS),
    # steady-state progress
    _s("prefill_batch", r"Prefill batch[.,]", PREFILL_PROGRESS),
    _s("decode_batch", r"Decode batch[.,]", DECODE_PROGRESS),
    # GPU faults: the context is poisoned
    _s("ima", r"CUDA error: an illegal memory access was encountered", "crash", "illegal_memory_access"),
    _s("xid", r"\bXid \([^)]*\): (?:48|62|63|64|74|79|92|94|95)\b", "gpu_fault"),
    _s("fallen_off_bus", r"GPU has fallen off the bus", "gpu_fault"),
    _s("ecc", r"uncorrectable ECC error", "gpu_fault"),
    # memory
    _s(
        "cuda_oom",
        r"(?:torch\.)?OutOfMemoryError: CUDA out of memory|CUDA out of memory\. Tried to allocate",
        "oom",
    ),
    _s("prefill_oom", r"Prefill out of memory\. Try to lower your batch size", "oom"),
    _s("decode_oom", r"Decode out of memory", "oom"),
    _s("pool_too_small", r"Not enough memory\. Please try to increase --mem-fraction-static", "oom"),
    # hangs detected inside SGLang or torch
    _s(
        "sched_watchdog",
        r"[Ww]atchdog timeout \(self\.watchdog_timeout=[\d.]+(?:, self\.soft=False)?\)",
        "decode_wedge",
    ),
    _s("nccl_timeout", r"Watchdog caught collective operation timeout: WorkNCCL\(", "collective_hang"),
    _s("gloo_timeout", r"Timed out waiting \d+ms for (?:recv|send) operation to complete", "collective_hang"),
    # crashes and fail-stop teardown
    _s(
        "sched_exception",
        r"(?:Scheduler|DetokenizerManager|DataParallelController|TokenizerManager|MultiDetokenizerRouter) hit an exception",
        "crash",
    ),
    _s("sigquit_child", r"Received sigquit from a child proces", "crash"),
    _s("sigquit", r"SIGQUIT received\.", "crash"),
    _s("subprocess_crash", r"Subprocess \S+ \(pid=\d+\) crashed with exit code", "crash"),
    _s("pg_watchdog", r"Process group watchdog thread terminated with exception", "crash"),
    _s("cpp_terminate", r"terminate called after throwing an instance of", "crash"),
    _s("nccl_error", r"NCCL error|ncclInternalError|ncclSystemError", "crash"),
    _s("py_fatal", r"Fatal Python error: (?:Aborted|Segmentation fault)", "crash"),
    # startup deaths
    _s("init_death", r"Rank \d+ scheduler died during initialization", "startup_failure"),
    _s("rank_dead", r"Rank \d+ scheduler is dead", "startup_failure"),
    _s("init_failed", r"Initialization failed\.", "startup_failure"),
    _s("graph_failed", r"Capture cuda graph failed", "startup_failure"),
    _s("bus_error", r"Fatal Python error: Bus error", "startup_failure", "dev_shm"),
    _s("zmq_in_use", r"ZMQError: Address already in use", "startup_failure", "port_in_use"),
    _s("rpc_port", r"rpc_port \S+ is used by a process already", "startup_failure", "port_in_use"),
    _s("errno98", r"\[Errno 98\]", "startup_failure", "port_in_use"),
    # PD transfer failures
    _s("kv_transfer_error", r"KVTransferError\(bootstrap_room=", "pd_transfer_wedge"),
    _s("decode_dead", r"Decode instance could be dead", "pd_transfer_wedge"),
    _s("prefill_bootstrap_failed", r"Prefill bootstrap failed for request", "pd_transfer_wedge"),
    _s("transfer_failed", r"(?:Decode|Prefill) transfer failed for request", "pd_transfer_wedge"),
    _s("transfer_worker", r"Unexpected transfer worker error for room", "pd_transfer_wedge"),
    _s(
        "kv_done_missing", r"Some requests fail to receive KV Cache transfer done signal", "pd_transfer_wedge"
    ),
    _s("bootstrap_timeout", r"Some requests timed out when bootstrapping", "pd_transfer_wedge"),
    _s("kvpoll_timeout", r"Request \d+ timed out after [\d.]+s in KVPoll\.", "pd_transfer_wedge"),
    _s("lost_prefill", r"Lost connection with prefill instance", "pd_transfer_wedge"),
    # warnings: evidence, not decisive
    _s("health_failed", r"Health check failed\. Server couldn't get a response from detokenizer", WARNING),
    _s("soft_watchdog", r"watchdog timeout \(self\.watchdog_timeout=[\d.]+, self\.soft=True\)", WARNING),
    _s("zombie_rid", r"Received output for rid=\S+ but the state was deleted in TokenizerManager", WARNING),
    _s("retract", r"KV cache pool is full\. Retract requests", WARNING),
    _s("abort_req", r"Aborted by AbortReq", WARNING),
    _s("pyspy_dump", r"Pyspy (?:dump for PID|failed)", WARNING),
)

# Every pattern above contains one of these words; a line with none of them is skipped without a regex.
_KEYWORDS = re.compile(
    r"ready to roll|torch distributed|warmup|Load weight|checkpoint shards|KV Cache|Memory pool|cuda graph|"
    r"DeepGEMM|max_total_num_tokens|Uvicorn|Application startup|server process|batch|CUDA|Xid|fallen off|ECC|"
    r"memory|atchdog|Timed out|exception|sigquit|SIGQUIT|crashed|terminate|NCCL|nccl|Fatal Python|scheduler|"
    r"Initialization|Address already|rpc_port|Errno|KVTransfer|Decode instance|bootstrap|transfer|KVPoll|"
    r"Lost connection|Health check|Received output|Retract|AbortReq|Pyspy",
    re.IGNORECASE,
)
_COMBINED = re.compile("|".join(f"(?P<s{i}>{sig.pattern})" for i, sig in enumerate(CATALOG)))
_BY_GROUP = {f"s{i}": sig for i, sig in enumerate(CATALOG)}
_PROGRESS_KINDS = frozenset((STARTUP_PROGRESS, PREFILL_PROGRESS, DECODE_PROGRESS, READY))


def classify(line: str) -> Signature | None:
    """The first catalogued signature found in `line`, or None."""
    if not _KEYWORDS.search(line):
        return None
    match = _COMBINED.search(line)
    if match is None or match.lastgroup is None:
        return None
    return _BY_GROUP[match.lastgroup]


def scan(lines: Iterable[str]) -> list[Hit]:
    """Every catalogued line among `lines`, in order."""
    hits: list[Hit] = []
    for line in lines:
        sig = classify(line)
        if sig is not None:
            hits.append(Hit(sig, line))
    return hits


def is_progress(sig: Signature) -> bool:
    """True for lines that show the server moving (startup phases, batches, readiness)."""
    return sig.kind in _PROGRESS_KINDS
