"""The drills: which faults can be drilled on the demo deployment, how each is triggered and what the supervisor
is expected to do, and the deployment a drill runs (`drill_config`)."""

from __future__ import annotations

import tomllib
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from simulator.faults import CATALOG
from supervisor.training.demo import demo_config

if TYPE_CHECKING:  # the config models load pydantic: not for `drill --list` or `--help`
    from supervisor.config import Config

TP = 2
STALL_AFTER_S = 10.0  # the drill's `stall_after_s` (production default: 20 s)


@dataclass(frozen=True)
class Drill:
    """How to trigger one scenario and what the supervisor is expected to do about it."""

    traffic: str  # "requests" (sequential chats) | "streams" (concurrent) | "long" | "disconnects"
    count: int
    expect: str
    extra_args: tuple[str, ...] = ()
    probes: Mapping[str, Any] = field(default_factory=dict)
    trigger: Mapping[str, Any] = field(default_factory=dict)


_WEDGE = "collective_hang or decode_wedge: forensics, SIGKILL, relaunch with --disable-overlap-schedule"
_CRASH = "crash: kill the group, reap, verify the GPUs free, relaunch"
DRILLS: dict[str, Drill] = {
    "overlap_tp_desync_hang": Drill("requests", 4, _WEDGE),
    "watchdog_disabled_silent_wedge": Drill("requests", 4, _WEDGE, ("--watchdog-timeout", "1000000")),
    "custom_allreduce_spin_sigterm_immune": Drill("requests", 3, _WEDGE + " (SIGTERM is ignored)"),
    "spec_decode_kernel_spin": Drill(
        "long", 1, _WEDGE, ("--speculative-algorithm", "EAGLE"), trigger={"max_tokens_ge": 32}
    ),
    "runtime_cuda_oom_crash": Drill("requests", 3, "oom or " + _CRASH),
    "illegal_memory_access": Drill("streams", 8, _CRASH),
    "zombie_after_cpp_abort": Drill("requests", 3, _CRASH + " (a rank died, the HTTP server lived on)"),
    "dev_shm_crashloop": Drill("requests", 3, "oom or " + _CRASH + "; stale /dev/shm files swept"),
    "tool_markup_leak_under_load": Drill(
        "streams", 16, "stream_leak: degraded and alerted, no restart", probes={"stream_canary_period_s": 5}
    ),
    "abort_storm_tokenizer_crash": Drill("disconnects", 24, _CRASH),
}
_PD = "needs a prefill/decode deployment"
_LAUNCH = "a launch-time fault: try `sglang-supervisor demo --scenario NAME`"
NOT_DRILLS = {
    "pd_decode_transfer_wedge": _PD,
    "nixl_transfer_worker_assert": _PD,
    "prefill_replaced_decode_stale": _PD,
    "orphans_hold_gpu_and_ports": _LAUNCH,
    "health_probe_pileup": _LAUNCH,
    "slow_startup_deepgemm": _LAUNCH,
    "restart_same_port_hang": _LAUNCH,
    "health_false_negative_long_prefill": "the supervisor is expected to do nothing (busy, not broken)",
    "dp_rank_wedge": "needs a data-parallel deployment (`--dp-size 2`)",
    "request_stuck": "needs the request log (`--log-requests --log-requests-format json`)",
    "brownout": "needs a steady client for a baseline first; the supervisor is expected to alert, not restart",
    "dp_rank_slow": "needs a data-parallel deployment; the supervisor is expected to do nothing (slow, moving)",
}


def drill_config(root: Path, drill: Drill, http_port: int, sglang_port: int) -> Config:
    """The demo deployment on TP=2 with a unique server name, fast backoff and the drill's probe settings;
    its status endpoint on `http_port`, the simulated SGLang on `sglang_port`."""
    from supervisor.config import parse_config

    data = tomllib.loads(demo_config(root, None, http_port, sglang_port))
    server = data["servers"][0]
    server["name"] = f"drill-{uuid.uuid4().hex[:6]}"  # never reaps another deployment's processes
    args = server["args"]
    args[args.index("--tp-size") + 1] = str(TP)
    args += list(drill.extra_args)
    server["gpus"] = list(range(TP))
    server["gpu_device_paths"] = server["gpu_device_paths"][:TP]
    server["env"]["SGLANG_SIM_STARTUP_S"] = "0.5"
    server["probes"].update({"stall_after_s": STALL_AFTER_S, **drill.probes})
    data["supervisor"]["restart"]["initial_s"] = 0.5
    token = root / "control.token"
    token.write_text(uuid.uuid4().hex + "\n")
    token.chmod(0o600)
    return parse_config(data, root, {})


def drill_lines() -> list[str]:
    """One line per drill: its name, the fault it injects and what the supervisor is expected to do."""
    width = max(len(name) for name in DRILLS)
    return [
        f"{name:<{width}} — {CATALOG[name][1]} → {drill.expect}" for name, drill in sorted(DRILLS.items())
    ]
