"""The log-line catalog against the real lines quoted in failure-modes.md §0.5 and sglang-internals.md §6."""

from __future__ import annotations

import re

import pytest

from policies.signatures import CATALOG, classify, scan

# (a real line, the signature that must name it)
REAL_LINES: tuple[tuple[str, str], ...] = (
    ("[2026-07-20 12:00:00] The server is fired up and ready to roll!", "ready"),
    ("[2026-07-20 12:00:00 TP0] Init torch distributed begin.", "init_dist"),
    ("[2026-07-20 12:00:01 TP0] Init torch distributed ends. elapsed=1.02 s, mem usage=0.96 GB", "init_dist"),
    (
        "[2026-07-20 12:00:01 TP0] NCCL/RCCL/HCCL warmup completed in 0.52 s (tp_size=8, pp_size=1, ep_size=1)",
        "nccl_warmup",
    ),
    ("[2026-07-20 12:00:02 TP0] Load weight begin. avail mem=138.42 GB", "load_weight"),
    ("Loading safetensors checkpoint shards:  38% Completed | 61/163 [01:02<01:55,  1.15it/s]", "shards"),
    (
        "[2026-07-20 12:03:02 TP0] Load weight end. elapsed=180.21 s, type=DeepseekV3ForCausalLM, avail mem=62.31 GB, mem usage=76.11 GB.",
        "load_weight",
    ),
    (
        "[2026-07-20 12:03:03 TP0] KV Cache is allocated. dtype: torch.bfloat16, #tokens: 1048576, KV size: 58.21 GB",
        "kv_alloc",
    ),
    ("[2026-07-20 12:03:03 TP0] Memory pool end. avail mem=4.10 GB", "mem_pool"),
    (
        "[2026-07-20 12:03:04 TP0] Capture target decode CUDA graph begin. backend=full, num_tokens_per_req=1, bs=[1, 2, 4, 8], avail mem=4.10 GB",
        "graph_capture",
    ),
    (
        "[2026-07-20 12:03:09 TP0] Capture cuda graph begin. This can take up to several minutes. avail mem=4.10 GB",
        "graph_capture",
    ),
    ("[2026-07-20 12:03:09 TP0] Capture cuda graph end. Time elapsed: 5.02 s", "graph_capture"),
    (
        "[2026-07-20 12:03:10 TP0] Entering DeepGEMM JIT Pre-Compile session. It may take a long time (typically 10-20 mins) if you have not run `sglang.compile_deep_gemm`.",
        "deepgemm_enter",
    ),
    (
        "[2026-07-20 12:05:10 TP0] DeepGEMM JIT Compiling for <gemm_fp8_fp8_bf16_nt> M=[1..4096] N=7168 K=2048: 45%",
        "deepgemm_progress",
    ),
    (
        "[2026-07-20 12:15:10 TP0] max_total_num_tokens=1048576, chunked_prefill_size=8192, max_prefill_tokens=16384, max_running_requests=512, context_len=131072, available_gpu_mem=3.69 GB",
        "max_tokens",
    ),
    (
        "[2026-07-20 12:15:11] INFO:     Uvicorn running on http://127.0.0.1:30000 (Press CTRL+C to quit)",
        "uvicorn",
    ),
    ("[2026-07-20 12:15:11] Start of pd disaggregation warmup ...", "pd_warmup"),
    (
        "[2026-07-20 12:15:12 TP0] Prefill batch, #new-seq: 1, #new-token: 7, #cached-token: 0, token usage: 0.00, #running-req: 0, #queue-req: 0, cuda graph: False, input throughput (token/s): 12.1",
        "prefill_batch",
    ),
    (
        "[2025-01-20 12:15:12 TP0] Prefill batch. #new-seq: 1, #new-token: 7, #cached-token: 0",
        "prefill_batch",
    ),
    (
        "[2026-07-20 12:15:13 TP0] Decode batch, #running-req: 3, #token: 192, token usage: 0.07, cuda graph: True, gen throughput (token/s): 150.00, #queue-req: 0",
        "decode_batch",
    ),
    ("RuntimeError: CUDA error: an illegal memory access was encountered", "ima"),
    (
        "[Tue Jul 21 03:12:44 2026] NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.",
        "xid",
    ),
    (
        "[Tue Jul 21 03:12:44 2026] NVRM: Xid (PCI:0000:48:00): 48, pid=1234, An uncorrectable double bit error",
        "xid",
    ),
    (
        "Unable to determine the device handle for GPU 0000:3B:00.0: GPU has fallen off the bus.",
        "fallen_off_bus",
    ),
    ("RuntimeError: CUDA error: uncorrectable ECC error encountered", "ecc"),
    (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 616.00 MiB. GPU 0 has a total capacity of 79.10 GiB",
        "cuda_oom",
    ),
    ("[2026-07-20 12:20:00 TP0] Prefill out of memory. Try to lower your batch size.", "prefill_oom"),
    ("[2026-07-20 12:20:00 TP0] Decode out of memory happened", "decode_oom"),
    ("RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.", "pool_too_small"),
    (
        "[2026-07-20 12:25:00 TP0] Scheduler watchdog timeout (self.watchdog_timeout=300, self.soft=False)",
        "sched_watchdog",
    ),
    ("[2025-06-01 12:25:00 TP0] Watchdog timeout (self.watchdog_timeout=300)", "sched_watchdog"),
    (
        "[rank0]:[E720 12:30:00 ProcessGroupNCCL.cpp:616] [Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=12, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600004 milliseconds before timing out.",
        "nccl_timeout",
    ),
    (
        "RuntimeError: [../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 7200000ms for recv operation to complete",
        "gloo_timeout",
    ),
    (
        "[2026-07-20 12:20:01 TP0] Scheduler hit an exception: Traceback (most recent call last):",
        "sched_exception",
    ),
    (
        "[2026-07-20 12:20:01] DetokenizerManager hit an exception: Traceback (most recent call last):",
        "sched_exception",
    ),
    (
        "[2026-07-20 12:20:01] Received sigquit from a child process. It usually means the child failed.",
        "sigquit_child",
    ),
    (
        "[2024-03-01 12:20:01] Received sigquit from a child proces. It usually means the child failed.",
        "sigquit_child",
    ),
    (
        "[2026-07-20 12:20:01] SIGQUIT received. signum=None, frame=None. It usually means one child failed.",
        "sigquit",
    ),
    (
        "[2026-07-20 12:20:01] Subprocess scheduler_0 (pid=4242) crashed with exit code -11. Triggering SIGQUIT for cleanup...",
        "subprocess_crash",
    ),
    (
        "[PG ID 2 PG GUID 3 Rank 0] Process group watchdog thread terminated with exception: CUDA error: unspecified launch failure",
        "pg_watchdog",
    ),
    ("terminate called after throwing an instance of 'c10::DistBackendError'", "cpp_terminate"),
    ("RuntimeError: NCCL error: unhandled system error (run with NCCL_DEBUG=INFO for details)", "nccl_error"),
    ("Fatal Python error: Aborted", "py_fatal"),
    (
        "[2026-07-20 12:00:30] Rank 0 scheduler died during initialization (exit code: -7). If exit code is -9 (SIGKILL), a common cause is the OS OOM killer.",
        "init_death",
    ),
    ("[2026-07-20 12:00:30] Rank 0 scheduler is dead. Please check if there are relevant logs.", "rank_dead"),
    (
        "[2026-07-20 12:00:30] Initialization failed. warmup error: Traceback (most recent call last):",
        "init_failed",
    ),
    ("[2026-07-20 12:00:30 TP0] Capture cuda graph failed: CUDA out of memory", "graph_failed"),
    ("Fatal Python error: Bus error", "bus_error"),
    ("zmq.error.ZMQError: Address already in use (addr='tcp://127.0.0.1:50000')", "zmq_in_use"),
    ("RuntimeError: rpc_port 29500 is used by a process already", "rpc_port"),
    (
        "ERROR:    [Errno 98] error while attempting to bind on address ('127.0.0.1', 30000): address already in use",
        "errno98",
    ),
    (
        "KVTransferError(bootstrap_room=1788380104266545413): Failed to get kvcache from prefill instance, it might be dead",
        "kv_transfer_error",
    ),
    ("Decode instance could be dead, remote mooncake session is not alive", "decode_dead"),
    (
        "Prefill bootstrap failed for request rank=0 req.rid='abc' req.bootstrap_room=5",
        "prefill_bootstrap_failed",
    ),
    (
        "Decode transfer failed for request rank=0 decode_req.req.rid='abc' decode_req.req.bootstrap_room=5",
        "transfer_failed",
    ),
    (
        "Unexpected transfer worker error for room 1788380104266545413: Traceback (most recent call last):",
        "transfer_worker",
    ),
    (
        "Some requests fail to receive KV Cache transfer done signal after bootstrapping. If a greater mean TTFT is acceptable, you can 'export SGLANG_DISAGGREGATION_WAITING_TIMEOUT=600'",
        "kv_done_missing",
    ),
    (
        "Some requests timed out when bootstrapping, which means prefill instances fail to receive the KV indices",
        "bootstrap_timeout",
    ),
    ("Request 1788380104266545413 timed out after 300.0s in KVPoll.Bootstrapping", "kvpoll_timeout"),
    ("Lost connection with prefill instance (bootstrap_addr: 10.0.0.1:8998)", "lost_prefill"),
    (
        "[2026-07-20 12:40:00] Health check failed. Server couldn't get a response from detokenizer for last 20 seconds. tic start time: 12:39:40. last_heartbeat time: 12:39:12",
        "health_failed",
    ),
    (
        "[2026-07-20 12:40:00] TokenizerManager watchdog timeout (self.watchdog_timeout=300, self.soft=True)",
        "soft_watchdog",
    ),
    ("Received output for rid='4f2a' but the state was deleted in TokenizerManager.", "zombie_rid"),
    (
        "[2026-07-20 12:40:00 TP0] KV cache pool is full. Retract requests. #retracted_reqs: 1, #new_token_ratio: 0.4",
        "retract",
    ),
    ("Aborted by AbortReq.", "abort_req"),
    ("[2026-07-20 12:25:00 TP0] Pyspy dump for PID 4242", "pyspy_dump"),
    ("[2026-12-01 01:28:40 TP0] Init parallel begin.", "init_dist"),  # SGLang 0.5.23
    ("[2026-12-01 01:28:41 TP0] Init parallel ends. elapsed=0.81 s", "init_dist"),
)

ORDINARY_LINES = (
    '[2026-07-20 12:00:00] INFO:     127.0.0.1:51234 - "GET /health HTTP/1.1" 200 OK',
    '[2026-07-20 12:00:00] INFO:     127.0.0.1:51234 - "POST /v1/chat/completions HTTP/1.1" 200 OK',
    "[2026-07-20 12:00:00] server_args={'model_path': 'moonshotai/Kimi-K2.5', 'tp_size': 8}",
    "[Tue Jul 21 03:12:44 2026] NVRM: Xid (PCI:0000:48:00): 13, pid=1234, Graphics Exception",
    "",
)


@pytest.mark.parametrize(("line", "name"), REAL_LINES)
def test_real_line_maps_to_its_signature(line: str, name: str) -> None:
    """Each real SGLang / torch / driver line is named by the catalogued signature."""
    sig = classify(line)
    assert sig is not None, line
    assert sig.name == name


def test_every_signature_has_a_real_line() -> None:
    """No catalogue entry is untested."""
    assert {s.name for s in CATALOG} == {name for _, name in REAL_LINES}


@pytest.mark.parametrize("line", ORDINARY_LINES)
def test_ordinary_lines_match_nothing(line: str) -> None:
    """Access logs, server_args and a non-fatal Xid are not signatures."""
    assert classify(line) is None


def test_keyword_prefilter_never_hides_a_signature() -> None:
    """The cheap pre-filter passes every line the full regex would match."""
    for line, _ in REAL_LINES:
        direct = [s for s in CATALOG if re.search(s.pattern, line)]
        assert direct, line
        assert classify(line) is not None


def test_fault_kinds_are_contract_names() -> None:
    """Fatal signatures name fault kinds of docs/contracts.md."""
    kinds = {
        "crash",
        "startup_failure",
        "decode_wedge",
        "collective_hang",
        "pd_transfer_wedge",
        "oom",
        "gpu_fault",
    }
    assert {s.kind for s in CATALOG if s.fatal} <= kinds


def test_scan_keeps_order_and_only_fatal_lines_are_fatal() -> None:
    """scan returns hits in log order; a progress line is not fatal, a crash is."""
    hits = scan([REAL_LINES[4][0], ORDINARY_LINES[0], REAL_LINES[33][0]])
    assert [h.signature.name for h in hits] == ["load_weight", "sched_exception"]
    assert not hits[0].signature.fatal
    assert hits[1].signature.fatal
