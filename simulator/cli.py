"""The simulator's command line: a subset of SGLang 0.5.23's `launch_server` flags, parsed as SGLang does.

Every option string here exists in real SGLang 0.5.23 with the same type, default, choices and aliases, so
an argv the simulator accepts is one the real server accepts (the `real` test tier checks this). Like
argparse in SGLang, unique prefixes are accepted (`--tp 8`), ambiguous ones and unknown flags exit 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, NamedTuple

TOOL_CALL_PARSERS: tuple[str, ...] = (
    "apertus2509", "beam", "cohere_command4", "deepseekv3", "deepseekv31", "deepseekv32", "deepseekv4",
    "deepseekv41", "dots", "glm", "glm45", "glm47", "gpt-oss", "k2_horizon", "kimi_k2", "kimi_k3", "lfm2",
    "ling3", "llama3", "mimo", "minicpm5", "mistral", "muse", "poolside_v1", "pythonic", "qwen", "qwen25",
    "qwen3_coder", "spark25", "step3", "step3p5", "minimax-m2", "minimax-m3", "nanbeige", "trinity",
    "interns1", "hermes", "hunyuan", "gigachat3", "gigachat35", "gemma4", "inkling", "iquest_q1",
    "response_template",
)  # fmt: skip
REASONING_PARSERS: tuple[str, ...] = (
    "apertus2509", "beam", "deepseek-r1", "deepseek-v3", "deepseek-v4", "deepseek-v41", "dots", "glm45",
    "ling3", "hunyuan", "gpt-oss", "k2_horizon", "kimi", "kimi_k2", "kimi_k3", "mimo", "muse", "poolside_v1",
    "qwen3", "qwen3-thinking", "minimax", "minimax-append-think", "minimax-m3", "nanbeige", "step3",
    "step3p5", "mistral", "nemotron_3", "granite_thinking_parser", "interns1", "gemma4", "inkling",
    "iquest_q1", "cohere_command4", "gigachat35", "response_template",
)  # fmt: skip
ATTENTION_BACKENDS: tuple[str, ...] = (
    "triton", "torch_native", "flex_attention", "dsa", "nsa", "qsa", "dsv4", "compressed", "fa3", "fa4",
    "flashinfer", "llada2_cfg_flashinfer", "flashmla", "trtllm_mla", "cutedsl_mla", "tokenspeed_mla",
    "trtllm_mha", "hpc_ops", "minicpm_flashattn", "minicpm_flashinfer", "aiter", "wave", "intel_amx",
    "ascend", "intel_xpu",
)  # fmt: skip
KV_CACHE_DTYPES = ("auto", "fp8_e5m2", "fp8_e4m3", "mxfp8", "bf16", "bfloat16", "nvfp4", "fp4_mx_block16")
CUDA_GRAPH_BACKENDS = ("full", "breakable", "disabled")
DISAGGREGATION_MODES = ("null", "prefill", "decode")
TRANSFER_BACKENDS = ("mooncake", "nixl", "ascend", "fake", "mori", "mooncake_tcp")

_SI = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
_IEC = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
_SIZE = re.compile(r"(\d+)(?:\.(\d+))?(Ki|Mi|Gi|Ti|k|M|G|T)")


def _token_count(text: str) -> int:
    """An integer with an optional SI (`128k`, `1.5M`) or IEC (`32Ki`) suffix, as SGLang's token flags take."""
    match = _SIZE.fullmatch(text.strip())
    if match is None:
        try:
            return int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"Invalid integer value: '{text}'. Use a plain integer, SI suffixes (1k, 1M), "
                "or IEC suffixes (1Ki, 1Mi). Suffixes are case-sensitive."
            ) from None
    whole, fraction, suffix = str(match[1]), match[2], str(match[3])
    if suffix in _IEC:
        if fraction is not None:
            raise argparse.ArgumentTypeError(f"Decimals are not allowed with IEC suffixes like '{suffix}'.")
        return int(whole) * _IEC[suffix]
    return int(Decimal(f"{whole}.{fraction or 0}") * _SI[suffix])


def _cuda_graph_backend(text: str) -> str:
    """A CUDA graph backend name; `tc_piecewise` was removed in 0.5.23 and is refused with SGLang's words."""
    if text == "tc_piecewise":
        raise argparse.ArgumentTypeError("tc_piecewise was removed; select breakable, full, or disabled")
    return text


@dataclass(frozen=True)
class SimServerArgs:
    """The parsed launch flags, one field per flag, named as SGLang's `ServerArgs` fields."""

    model_path: str
    tokenizer_path: str | None = None
    tokenizer_worker_num: int = 1
    detokenizer_worker_num: int = 1
    trust_remote_code: bool = False
    context_length: int | None = None
    kv_cache_dtype: str = "auto"
    mem_fraction_static: float | None = None
    max_running_requests: int | None = None
    max_total_tokens: int | None = None
    chunked_prefill_size: int | None = None
    max_prefill_tokens: int = 16384
    schedule_conservativeness: float = 1.0
    page_size: int | None = None
    disable_radix_cache: bool = False
    disable_overlap_schedule: bool = False
    dist_timeout: int | None = None
    dist_init_addr: str | None = None
    nnodes: int = 1
    node_rank: int = 0
    tp_size: int = 1
    pp_size: int = 1
    dp_size: int = 1
    ep_size: int = 1
    base_gpu_id: int = 0
    gpu_id_step: int = 1
    watchdog_timeout: float = 300.0
    soft_watchdog_timeout: float | None = None
    host: str = "127.0.0.1"
    port: int = 30000
    skip_server_warmup: bool = False
    api_key: str | None = dataclasses.field(default=None, repr=False)
    admin_api_key: str | None = dataclasses.field(default=None, repr=False)
    served_model_name: str | None = None
    stream_interval: int = 1
    log_level: str = "info"
    log_requests: bool = False
    log_requests_level: int = 2
    log_requests_format: str = "text"
    enable_metrics: bool = False
    decode_log_interval: int = 40
    attention_backend: str | None = None
    cuda_graph_backend_decode: str | None = None
    cuda_graph_backend_prefill: str | None = None
    cuda_graph_max_bs_decode: int | None = None
    cuda_graph_max_bs_prefill: int | None = None
    disable_cuda_graph: bool = False
    disable_custom_all_reduce: bool = False
    num_continuous_decode_steps: int = 1
    enable_torch_compile: bool = False
    enable_dp_attention: bool = False
    speculative_algorithm: str | None = None
    speculative_draft_model_path: str | None = None
    speculative_num_steps: int | None = None
    speculative_eagle_topk: int | None = None
    speculative_num_draft_tokens: int | None = None
    disaggregation_mode: str = "null"
    disaggregation_transfer_backend: str = "mooncake"
    disaggregation_bootstrap_port: int = 8998
    disaggregation_ib_device: str | None = None
    reasoning_parser: str | None = None
    tool_call_parser: str | None = None
    argv: tuple[str, ...] = dataclasses.field(default=(), repr=False)

    @property
    def served_name(self) -> str:
        """The model name clients must send: `--served-model-name`, else `--model-path`."""
        return self.served_model_name or self.model_path

    def url(self) -> str:
        """SGLang's `ServerArgs.url()`: where its own requests (the warmup) reach it; a wildcard is loopback."""
        host = self.host[1:-1] if self.host.startswith("[") and self.host.endswith("]") else self.host
        host = "127.0.0.1" if host in ("", "0.0.0.0") else "::1" if host == "::" else host
        return f"http://[{host}]:{self.port}" if ":" in host else f"http://{host}:{self.port}"

    def listen_url(self) -> str:
        """The address as uvicorn prints it in `Uvicorn running on …` (an IPv6 host in brackets)."""
        return f"http://[{self.host}]:{self.port}" if ":" in self.host else f"http://{self.host}:{self.port}"

    def server_info(self) -> dict[str, object]:
        """The `server_args` part of SGLang's `/server_info` body (field -> value); the API key is masked."""
        info: dict[str, object] = {
            f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "argv"
        }
        for key in ("api_key", "admin_api_key"):
            if info[key] is not None:
                info[key] = "<redacted>"
        return info


class _Flag(NamedTuple):
    dest: str
    help: str
    type: Callable[[str], Any] | None = None  # None: a boolean switch
    aliases: tuple[str, ...] = ()
    choices: tuple[str, ...] | tuple[int, ...] | None = None


_FLAGS: tuple[_Flag, ...] = (
    _Flag("model_path", "Path or Hugging Face id of the model weights.", str, ("--model",)),
    _Flag("tokenizer_path", "Path of the tokenizer (defaults to the model path).", str),
    _Flag("tokenizer_worker_num", "Number of tokenizer manager workers.", int),
    _Flag("detokenizer_worker_num", "Number of detokenizer workers.", int),
    _Flag("trust_remote_code", "Allow custom model code from the hub."),
    _Flag("context_length", "Maximum context length (default: from the model config).", _token_count),
    _Flag("kv_cache_dtype", "Data type of the KV cache.", str, choices=KV_CACHE_DTYPES),
    _Flag("mem_fraction_static", "Fraction of GPU memory for weights and KV cache.", float),
    _Flag("max_running_requests", "Maximum number of running requests.", int),
    _Flag("max_total_tokens", "Maximum number of tokens in the KV cache pool.", _token_count),
    _Flag("chunked_prefill_size", "Maximum tokens per prefill chunk; -1 disables chunking.", int),
    _Flag("max_prefill_tokens", "Maximum tokens in one prefill batch.", _token_count),
    _Flag(
        "schedule_conservativeness", "How conservative the scheduler is (higher: fewer retractions).", float
    ),
    _Flag("page_size", "Tokens per KV cache page.", int),
    _Flag("disable_radix_cache", "Disable the prefix (radix) cache."),
    _Flag("disable_overlap_schedule", "Disable the overlap scheduler."),
    _Flag("dist_timeout", "Timeout in seconds of torch.distributed initialisation.", int),
    _Flag("dist_init_addr", "host:port of the distributed initialisation.", str, ("--nccl-init-addr",)),
    _Flag("nnodes", "Number of nodes.", int),
    _Flag("node_rank", "Rank of this node.", int),
    _Flag("tp_size", "Tensor parallel size.", int, ("--tensor-parallel-size",)),
    _Flag("pp_size", "Pipeline parallel size.", int, ("--pipeline-parallel-size",)),
    _Flag("dp_size", "Data parallel size.", int, ("--data-parallel-size",)),
    _Flag("ep_size", "Expert parallel size.", int, ("--expert-parallel-size", "--ep")),
    _Flag("base_gpu_id", "First GPU id to use.", int),
    _Flag("gpu_id_step", "Step between the GPU ids of consecutive ranks.", int),
    _Flag(
        "watchdog_timeout", "Seconds a forward batch may take before the watchdog kills the server.", float
    ),
    _Flag("soft_watchdog_timeout", "Seconds before the soft watchdog dumps stacks.", float),
    _Flag("host", "Host of the HTTP server.", str),
    _Flag("port", "Port of the HTTP server.", int),
    _Flag("skip_server_warmup", "Skip the warmup request."),
    _Flag("api_key", "API key clients must present.", str),
    _Flag("admin_api_key", "API key of the admin endpoints.", str),
    _Flag("served_model_name", "Model name reported by the OpenAI-compatible API.", str),
    _Flag("stream_interval", "Tokens between two streamed chunks.", int),
    _Flag("log_level", "Logging level.", str),
    _Flag("log_requests", "Log metadata, inputs, outputs of all requests (verbosity: --log-requests-level)."),
    _Flag(
        "log_requests_level",
        "0: metadata, 1: and sampling parameters, 2: partial input/output, 3: all.",
        int,
        choices=(0, 1, 2, 3),
    ),
    _Flag("log_requests_format", "Format of the request log.", str, choices=("text", "json")),
    _Flag("enable_metrics", "Expose Prometheus metrics on /metrics."),
    _Flag("decode_log_interval", "Decode batches between two decode log lines.", int),
    _Flag("attention_backend", "Attention kernel backend.", str, choices=ATTENTION_BACKENDS),
    _Flag(
        "cuda_graph_backend_decode",
        "CUDA graph backend of decode.",
        _cuda_graph_backend,
        (),
        CUDA_GRAPH_BACKENDS,
    ),
    _Flag(
        "cuda_graph_backend_prefill",
        "CUDA graph backend of prefill.",
        _cuda_graph_backend,
        (),
        CUDA_GRAPH_BACKENDS,
    ),
    _Flag("cuda_graph_max_bs_decode", "Largest batch size captured in a decode CUDA graph.", int),
    _Flag("cuda_graph_max_bs_prefill", "Largest token count captured in a prefill CUDA graph.", int),
    _Flag("disable_custom_all_reduce", "Use NCCL instead of the custom all-reduce."),
    _Flag("num_continuous_decode_steps", "Decode steps run in a row before the scheduler looks again.", int),
    _Flag("enable_torch_compile", "Compile the model with torch.compile."),
    _Flag("speculative_algorithm", "Speculative decoding algorithm (EAGLE, EAGLE3, NEXTN, ...).", str),
    _Flag("speculative_draft_model_path", "Draft model path.", str, ("--speculative-draft-model",)),
    _Flag("speculative_num_steps", "Draft steps per verification.", int),
    _Flag("speculative_eagle_topk", "Top-k of EAGLE drafting.", int),
    _Flag("speculative_num_draft_tokens", "Draft tokens per verification.", int),
    _Flag("disaggregation_mode", "PD disaggregation role.", str, choices=DISAGGREGATION_MODES),
    _Flag("disaggregation_transfer_backend", "KV transfer backend.", str, choices=TRANSFER_BACKENDS),
    _Flag("disaggregation_bootstrap_port", "Bootstrap server port of a prefill server.", int),
    _Flag("disaggregation_ib_device", "InfiniBand device(s) for the KV transfer.", str),
    _Flag(
        "reasoning_parser", "Reasoning parser ('auto' to detect).", str, choices=("auto", *REASONING_PARSERS)
    ),
    _Flag(
        "tool_call_parser", "Tool-call parser ('auto' to detect).", str, choices=("auto", *TOOL_CALL_PARSERS)
    ),
)

_DEPRECATED: tuple[tuple[str, str], ...] = (
    ("disable_cuda_graph", "--cuda-graph-backend-{decode,prefill}=disabled"),
    ("enable_dp_attention", "--attn-dp-size <dp-size>"),
)


class _DeprecatedSwitch(argparse.Action):
    """A retired boolean that still works and warns on stderr, as SGLang's deprecated switches do."""

    def __init__(self, option_strings: Sequence[str], dest: str, replacement: str, **kwargs: Any) -> None:
        self.replacement = replacement
        super().__init__(option_strings, dest, nargs=0, default=False, **kwargs)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        print(
            f"'{option_string}' is deprecated and will be removed in a future release. "
            f"Use '{self.replacement}' instead.",
            file=sys.stderr,
        )
        setattr(namespace, self.dest, True)


def _option(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of `python -m simulator.launch_server`."""
    parser = argparse.ArgumentParser(
        prog="launch_server", description="SGLang-compatible model server simulator."
    )
    defaults = {
        f.name: None if f.default is dataclasses.MISSING else f.default
        for f in dataclasses.fields(SimServerArgs)
    }
    for flag in _FLAGS:
        names = [_option(flag.dest), *flag.aliases]
        if flag.type is None:
            parser.add_argument(*names, dest=flag.dest, action="store_true", help=flag.help)
            continue
        parser.add_argument(
            *names,
            dest=flag.dest,
            type=flag.type,
            choices=flag.choices,
            default=defaults[flag.dest],
            required=flag.dest == "model_path",
            help=flag.help,
        )
    for dest, replacement in _DEPRECATED:
        parser.add_argument(
            _option(dest),
            dest=dest,
            action=_DeprecatedSwitch,
            replacement=replacement,
            help=f"Deprecated. Use {replacement} instead.",
        )
    return parser


def parse_server_args(argv: Sequence[str]) -> SimServerArgs:
    """Parse SGLang launch flags; on bad input print argparse's usage and error and exit 2."""
    namespace = build_parser().parse_args(list(argv))
    return SimServerArgs(argv=tuple(argv), **vars(namespace))
