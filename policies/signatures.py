"""The log-line catalog: SGLang's fatal, warning and progress lines, each mapped to what it means.

Strings come from `reference/failure-modes.md` §0.5 and `reference/sglang-internals.md` §6. The whole catalog
is compiled once and indexed by a word every matching line contains, so the many lines of a log flood that
cannot match anything (access logs, request dumps) cost a split and a few set lookups.

`kind` is a fault kind of docs/contracts.md for fatal lines, or one of the non-fault classes:
`ready` (startup complete), `startup_progress` (a loading phase moved), `prefill_progress` and
`decode_progress` (the scheduler produced a batch), `warning` (noted as evidence, never decisive alone).
"""

from __future__ import annotations

import re
import string
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
    words: tuple[str, ...] = ()  # at least one appears as a whole word in every matching line

    @property
    def fatal(self) -> bool:
        """True for lines that name a fault kind."""
        return self.kind not in (READY, STARTUP_PROGRESS, PREFILL_PROGRESS, DECODE_PROGRESS, WARNING)


@dataclass(frozen=True)
class Hit:
    """A catalogued line seen in the log."""

    signature: Signature
    line: str


def _s(name: str, words: str, pattern: str, kind: str, tag: str = "") -> Signature:
    return Signature(name, pattern, kind, tag, tuple(words.split()))


CATALOG: tuple[Signature, ...] = (
    # readiness and startup progress (P6: a slow start that logs progress is alive)
    _s("ready", "roll", r"The server is fired up and ready to roll!", READY),
    _s(
        "init_dist",
        "distributed parallel",
        r"Init (?:torch distributed|parallel) (?:begin|ends)",
        STARTUP_PROGRESS,
    ),
    _s("nccl_warmup", "warmup", r"(?:NCCL|RCCL|HCCL)/?\S* warmup completed", STARTUP_PROGRESS),
    _s("load_weight", "weight", r"Load weight (?:begin|end)", STARTUP_PROGRESS),
    _s("shards", "shards", r"Loading \S+ checkpoint shards:\s+\d+%", STARTUP_PROGRESS),
    _s("kv_alloc", "allocated", r"KV Cache is allocated", STARTUP_PROGRESS),
    _s("mem_pool", "pool", r"Memory pool end", STARTUP_PROGRESS),
    _s("graph_capture", "Capture", r"Capture (?:\w+ )*?(?i:cuda) graph (?:begin|end)", STARTUP_PROGRESS),
    _s("deepgemm_enter", "DeepGEMM", r"Entering DeepGEMM JIT", STARTUP_PROGRESS),
    _s("deepgemm_progress", "DeepGEMM", r"DeepGEMM JIT \w+", STARTUP_PROGRESS),
    _s("max_tokens", "max_total_num_tokens", r"max_total_num_tokens=\d+", STARTUP_PROGRESS),
    _s(
        "uvicorn",
        "Uvicorn Application Started",
        r"Uvicorn running on|Application startup complete|Started server process",
        STARTUP_PROGRESS,
    ),
    _s("pd_warmup", "warmup", r"(?:Start|End) of (?:pd )?disaggregation warmup", STARTUP_PROGRESS),
    # steady-state progress
    _s("prefill_batch", "batch", r"Prefill batch[.,]", PREFILL_PROGRESS),
    _s("decode_batch", "batch", r"Decode batch[.,]", DECODE_PROGRESS),
    # GPU faults: the context is poisoned
    _s(
        "ima",
        "illegal",
        r"CUDA error: an illegal memory access was encountered",
        "crash",
        "illegal_memory_access",
    ),
    _s("xid", "Xid", r"\bXid \([^)]*\): (?:48|62|63|64|74|79|92|94|95)\b", "gpu_fault"),
    _s("fallen_off_bus", "fallen", r"GPU has fallen off the bus", "gpu_fault"),
    _s("ecc", "ECC", r"uncorrectable ECC error", "gpu_fault"),
    # memory
    _s(
        "cuda_oom",
        "memory",
        r"(?:torch\.)?OutOfMemoryError: CUDA out of memory|CUDA out of memory\. Tried to allocate",
        "oom",
    ),
    _s("prefill_oom", "memory", r"Prefill out of memory\. Try to lower your batch size", "oom"),
    _s("decode_oom", "memory", r"Decode out of memory", "oom"),
    _s(
        "pool_too_small", "memory", r"Not enough memory\. Please try to increase --mem-fraction-static", "oom"
    ),
    # hangs detected inside SGLang or torch
    _s(
        "sched_watchdog",
        "timeout",
        r"[Ww]atchdog timeout \(self\.watchdog_timeout=[\d.]+(?:, self\.soft=False)?\)",
        "decode_wedge",
    ),
    _s(
        "nccl_timeout",
        "Watchdog",
        r"Watchdog caught collective operation timeout: WorkNCCL\(",
        "collective_hang",
    ),
    _s(
        "gloo_timeout",
        "Timed",
        r"Timed out waiting \d+ms for (?:recv|send) operation to complete",
        "collective_hang",
    ),
    # crashes and fail-stop teardown
    _s(
        "sched_exception",
        "exception",
        r"(?:Scheduler|DetokenizerManager|DataParallelController|TokenizerManager|MultiDetokenizerRouter) hit an exception",
        "crash",
    ),
    _s("sigquit_child", "sigquit", r"Received sigquit from a child proces", "crash"),
    _s("sigquit", "SIGQUIT", r"SIGQUIT received\.", "crash"),
    _s("subprocess_crash", "crashed", r"Subprocess \S+ \(pid=\d+\) crashed with exit code", "crash"),
    _s("pg_watchdog", "watchdog", r"Process group watchdog thread terminated with exception", "crash"),
    _s("cpp_terminate", "terminate", r"terminate called after throwing an instance of", "crash"),
    _s(
        "nccl_error",
        "NCCL ncclInternalError ncclSystemError",
        r"NCCL error|ncclInternalError|ncclSystemError",
        "crash",
    ),
    _s("py_fatal", "Fatal", r"Fatal Python error: (?:Aborted|Segmentation fault)", "crash"),
    # startup deaths
    _s("init_death", "initialization", r"Rank \d+ scheduler died during initialization", "startup_failure"),
    _s("rank_dead", "dead", r"Rank \d+ scheduler is dead", "startup_failure"),
    _s("init_failed", "Initialization", r"Initialization failed\.", "startup_failure"),
    _s("graph_failed", "Capture", r"Capture cuda graph failed", "startup_failure"),
    _s("bus_error", "Bus", r"Fatal Python error: Bus error", "startup_failure", "dev_shm"),
    _s("zmq_in_use", "ZMQError", r"ZMQError: Address already in use", "startup_failure", "port_in_use"),
    _s(
        "rpc_port", "rpc_port", r"rpc_port \S+ is used by a process already", "startup_failure", "port_in_use"
    ),
    _s("errno98", "Errno", r"\[Errno 98\]", "startup_failure", "port_in_use"),
    # PD transfer failures
    _s("kv_transfer_error", "KVTransferError", r"KVTransferError\(bootstrap_room=", "pd_transfer_wedge"),
    _s("decode_dead", "dead", r"Decode instance could be dead", "pd_transfer_wedge"),
    _s("prefill_bootstrap_failed", "bootstrap", r"Prefill bootstrap failed for request", "pd_transfer_wedge"),
    _s("transfer_failed", "transfer", r"(?:Decode|Prefill) transfer failed for request", "pd_transfer_wedge"),
    _s("transfer_worker", "worker", r"Unexpected transfer worker error for room", "pd_transfer_wedge"),
    _s(
        "kv_done_missing",
        "bootstrapping",
        r"Some requests fail to receive KV Cache transfer done signal",
        "pd_transfer_wedge",
    ),
    _s(
        "bootstrap_timeout",
        "bootstrapping",
        r"Some requests timed out when bootstrapping",
        "pd_transfer_wedge",
    ),
    _s("kvpoll_timeout", "KVPoll", r"Request \d+ timed out after [\d.]+s in KVPoll\.", "pd_transfer_wedge"),
    _s("lost_prefill", "Lost", r"Lost connection with prefill instance", "pd_transfer_wedge"),
    # warnings: evidence, not decisive
    _s(
        "health_failed",
        "detokenizer",
        r"Health check failed\. Server couldn't get a response from detokenizer",
        WARNING,
    ),
    _s(
        "soft_watchdog",
        "watchdog",
        r"watchdog timeout \(self\.watchdog_timeout=[\d.]+, self\.soft=True\)",
        WARNING,
    ),
    _s(
        "zombie_rid",
        "TokenizerManager",
        r"Received output for rid=\S+ but the state was deleted in TokenizerManager",
        WARNING,
    ),
    _s("retract", "Retract", r"KV cache pool is full\. Retract requests", WARNING),
    _s("abort_req", "AbortReq", r"Aborted by AbortReq", WARNING),
    _s("pyspy_dump", "Pyspy", r"Pyspy (?:dump for PID|failed)", WARNING),
)

# Punctuation (except `_`) becomes a space, so a line splits into the words the catalogue is indexed by.
_SPLIT = str.maketrans(dict.fromkeys(string.punctuation.replace("_", ""), " "))
_INDEX: dict[str, list[int]] = {}
for _i, _sig in enumerate(CATALOG):
    for _word in _sig.words:
        _INDEX.setdefault(_word, []).append(_i)
_COMPILED = tuple(re.compile(sig.pattern) for sig in CATALOG)


def classify(line: str) -> Signature | None:
    """The first catalogued signature (in catalogue order) found in `line`, or None.

    Only the signatures indexed by a word of the line are tried, so an ordinary line costs one split and one
    set lookup per word, and a candidate line one or two small regex searches.
    """
    candidates: set[int] = set()
    for word in set(line.translate(_SPLIT).split()):
        found = _INDEX.get(word)
        if found:
            candidates.update(found)
    for index in sorted(candidates):
        if _COMPILED[index].search(line):
            return CATALOG[index]
    return None


def scan(lines: Iterable[str]) -> list[Hit]:
    """Every catalogued line among `lines`, in order."""
    hits: list[Hit] = []
    for line in lines:
        sig = classify(line)
        if sig is not None:
            hits.append(Hit(sig, line))
    return hits
