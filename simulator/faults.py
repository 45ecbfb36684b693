"""Fault scenarios F1–F18 of `reference/failure-modes.md`: catalog, triggers, scenario files, recurrence.

A fault is *armed* at launch (from `SGLANG_SIM_SCENARIO`, the recurrence file, or `POST /sim/fault`)
and *fires* when its trigger holds. What a fired fault does is implemented where SGLang would show it
(engine, ranks, lifecycle); this module only decides which faults are armed and when they fire.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import threading
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from simulator.gpus import state_dir

# name -> (default trigger, one-line description)
CATALOG: dict[str, tuple[dict[str, Any], str]] = {
    "overlap_tp_desync_hang": (
        {"after_requests": 3},
        "TP ranks diverge into different collectives; /health 200",
    ),
    "watchdog_disabled_silent_wedge": (
        {"after_requests": 3},
        "as F1 but the watchdog never fires; /health 503",
    ),
    "pd_decode_transfer_wedge": ({"after_requests": 1}, "decode requests park in the transfer queue forever"),
    "pd_prompt_exceeds_decode_pool": (
        {"prompt_tokens_ge": 3000},
        "a prompt this long never pre-allocates on the decode and blocks every later request",
    ),
    "nixl_transfer_worker_assert": (
        {"after_requests": 1},
        "prefill transfer worker dies; later PD requests hang",
    ),
    "prefill_replaced_decode_stale": ({}, "decode keeps the old prefill endpoints after a prefill restart"),
    "custom_allreduce_spin_sigterm_immune": (
        {"after_requests": 2},
        "ranks spin in custom all-reduce, ignore SIGTERM",
    ),
    "spec_decode_kernel_spin": ({"max_tokens_ge": 256}, "long requests spin with speculative decoding on"),
    "runtime_cuda_oom_crash": ({"after_requests": 2}, "CUDA OOM in a scheduler, SIGQUIT teardown"),
    "illegal_memory_access": ({"concurrency_ge": 8}, "CUDA illegal memory access, Xid 13, rank aborts"),
    "zombie_after_cpp_abort": ({"after_requests": 2}, "a rank dies by C++ abort; the HTTP server lives on"),
    "orphans_hold_gpu_and_ports": (
        {"on_start": True},
        "ranks detach; after a parent kill they hold GPUs and ports",
    ),
    "dev_shm_crashloop": (
        {"after_requests": 2},
        "a crash leaks sgl_shm_* files; every start then dies of SIGBUS",
    ),
    "health_false_negative_long_prefill": (
        {"after_requests": 1},
        "25 s prefill chunks: /health 503 while busy",
    ),
    "health_probe_pileup": ({"on_start": True}, "timed-out health probes leave orphans; 5 of them crash"),
    "slow_startup_deepgemm": ({"on_start": True}, "a long DeepGEMM JIT startup with progress lines"),
    "tool_markup_leak_under_load": ({"concurrency_ge": 16}, "streamed tool markup leaks under concurrency"),
    "abort_storm_tokenizer_crash": (
        {"disconnects_ge": 20},
        "a burst of client disconnects crashes the tokenizer",
    ),
    "restart_same_port_hang": ({"on_start": True}, "after an unclean restart, requests hang after ~100"),
    "dp_rank_wedge": (
        {"after_requests": 3},
        "one DP rank (param dp_rank, the last by default) spins with a batch; the others serve",
    ),
    "request_stuck": (
        {"after_requests": 3},
        "one request (param count) never gets a token while the rest are served; param unabortable: an abort "
        "does not end it either",
    ),
    "brownout": (
        {"after_requests": 40},
        "every step `factor` (20) times slower, the batch pinned at `batch` (2) requests: the queue only grows",
    ),
    "dp_rank_slow": (
        {"after_requests": 3},
        "one DP rank's steps take `factor` (50) times longer; it still moves",
    ),
}

TRIGGER_KEYS = (
    "after_s",
    "after_requests",
    "concurrency_ge",
    "prompt_tokens_ge",
    "max_tokens_ge",
    "on_start",
    "disconnects_ge",
)


class ScenarioError(ValueError):
    """A scenario name or file that cannot be used."""


@dataclass
class Fault:
    """One armed fault."""

    name: str
    trigger: dict[str, Any]
    params: dict[str, Any] = field(default_factory=dict)
    recur_until_flag: str = ""
    recur: bool = False
    armed_at: float = field(default_factory=time.time)
    fired_at: float | None = None

    def describe(self) -> dict[str, Any]:
        """The `/sim/state` view of this fault."""
        return {
            "name": self.name,
            "trigger": self.trigger,
            "params": self.params,
            "recur_until_flag": self.recur_until_flag or None,
            "armed_at": self.armed_at,
            "fired": self.fired_at is not None,
            "started_at": self.fired_at,
        }


def make_fault(spec: dict[str, Any]) -> Fault:
    """Build a fault from a scenario entry / control-endpoint body, validating names and keys."""
    name = str(spec.get("name", ""))
    if name not in CATALOG:
        raise ScenarioError(f"unknown fault {name!r}; known: {', '.join(sorted(CATALOG))}")
    trigger = dict(CATALOG[name][0])
    given = {k: spec[k] for k in TRIGGER_KEYS if k in spec}
    if given:
        trigger = given
    unknown = set(spec) - set(TRIGGER_KEYS) - {"name", "params", "recur_until_flag", "recur"}
    if unknown:
        raise ScenarioError(f"fault {name}: unknown keys {sorted(unknown)}")
    flag = str(spec.get("recur_until_flag") or "")
    if flag and not flag.startswith("--"):
        raise ScenarioError(
            f"fault {name}: recur_until_flag must be an option string like --disable-overlap-schedule"
        )
    params = spec.get("params") or {}
    if not isinstance(params, dict):
        raise ScenarioError(f"fault {name}: params must be a table")
    return Fault(name, trigger, dict(params), flag, bool(spec.get("recur") or flag))


def load_scenario(value: str) -> list[Fault]:
    """`SGLANG_SIM_SCENARIO`: a fault name, or a TOML file with `[[fault]]` entries."""
    if not value:
        return []
    if value in CATALOG:
        return [make_fault({"name": value})]
    path = Path(value)
    if not path.is_file():
        raise ScenarioError(f"SGLANG_SIM_SCENARIO={value!r} is neither a fault name nor a file")
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ScenarioError(f"{path}: {exc}") from exc
    entries = data.get("fault", [])
    if not isinstance(entries, list):
        raise ScenarioError(f"{path}: [[fault]] entries expected")
    return [make_fault(e) for e in entries]


def flag_present(argv: list[str] | tuple[str, ...], flag: str) -> bool:
    """True when the launch argv carries the option (`--x` or `--x=v`)."""
    return any(a == flag or a.startswith(flag + "=") for a in argv)


class RecurStore:
    """Faults that recur on every launch (until a named flag is present), kept in the state dir."""

    def __init__(self, root: Path | None = None) -> None:
        self.path = (root or state_dir()) / "faults" / "recur.json"

    def _locked(self) -> Any:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        lock = open(self.path.with_suffix(".lock"), "a+")  # noqa: SIM115 - closed by the caller's context
        fcntl.flock(lock, fcntl.LOCK_EX)
        return lock

    def load(self) -> list[dict[str, Any]]:
        """Every recorded recurring fault spec."""
        with contextlib.suppress(OSError, ValueError):
            data = json.loads(self.path.read_text())
            if isinstance(data, list):
                return [d for d in data if isinstance(d, dict)]
        return []

    def remember(self, fault: Fault) -> None:
        """Record a recurring fault (replacing an earlier entry of the same name)."""
        with self._locked():
            entries = [e for e in self.load() if e.get("name") != fault.name]
            spec: dict[str, Any] = {
                "name": fault.name,
                **fault.trigger,
                "params": fault.params,
                "recur": True,
            }
            if fault.recur_until_flag:
                spec["recur_until_flag"] = fault.recur_until_flag
            entries.append(spec)
            self.path.write_text(json.dumps(entries))


class FaultBook:
    """The faults armed in this launch, and the counters their triggers look at (thread-safe)."""

    def __init__(self, argv: tuple[str, ...], recur: RecurStore | None = None) -> None:
        self.argv = argv
        self.recur = recur or RecurStore()
        self._lock = threading.Lock()
        self.faults: list[Fault] = []
        self.suppressed: list[dict[str, Any]] = []
        self.started = time.monotonic()
        self.requests = 0
        self.disconnects: list[float] = []

    def arm(self, fault: Fault, persist: bool = False) -> bool:
        """Arm a fault unless its cure flag is already in the argv; persist recurring ones when asked."""
        if persist and fault.recur:
            self.recur.remember(fault)
        if fault.recur_until_flag and flag_present(self.argv, fault.recur_until_flag):
            with self._lock:
                self.suppressed.append({"name": fault.name, "cured_by": fault.recur_until_flag})
            return False
        with self._lock:
            self.faults = [f for f in self.faults if f.name != fault.name] + [fault]
        return True

    def arm_launch(self, scenario: str) -> None:
        """Arm the recurring faults of the state dir and the scenario of the environment."""
        for spec in self.recur.load():
            with contextlib.suppress(ScenarioError):
                self.arm(make_fault(spec))
        for fault in load_scenario(scenario):
            self.arm(fault, persist=fault.recur)

    def get(self, name: str) -> Fault | None:
        """The armed fault of that name, fired or not."""
        with self._lock:
            return next((f for f in self.faults if f.name == name), None)

    def fired(self, name: str) -> Fault | None:
        """The fault of that name if it has fired."""
        f = self.get(name)
        return f if f is not None and f.fired_at is not None else None

    def count_request(self) -> None:
        """One more user request admitted."""
        with self._lock:
            self.requests += 1

    def count_disconnect(self) -> int:
        """A client went away mid-request; returns disconnects in the last 2 s."""
        now = time.monotonic()
        with self._lock:
            self.disconnects = [t for t in self.disconnects if now - t < 2.0] + [now]
            return len(self.disconnects)

    def check(self, name: str, *, concurrency: int = 0, prompt_tokens: int = 0, max_tokens: int = 0) -> bool:
        """Fire the named fault if it is armed and its trigger holds now; True once fired."""
        with self._lock:
            f = next((x for x in self.faults if x.name == name), None)
            if f is None:
                return False
            if f.fired_at is not None:
                return True
            t = f.trigger
            elapsed = time.monotonic() - self.started
            holds = (
                bool(t.get("on_start"))
                or ("after_s" in t and elapsed >= float(t["after_s"]))
                or ("after_requests" in t and self.requests >= int(t["after_requests"]))
                or ("concurrency_ge" in t and concurrency >= int(t["concurrency_ge"]))
                or ("prompt_tokens_ge" in t and prompt_tokens >= int(t["prompt_tokens_ge"]))
                or ("max_tokens_ge" in t and max_tokens >= int(t["max_tokens_ge"]))
                or ("disconnects_ge" in t and len(self.disconnects) >= int(t["disconnects_ge"]))
            )
            if holds:
                f.fired_at = time.time()
            return holds

    def state(self) -> dict[str, Any]:
        """The `/sim/state` view."""
        with self._lock:
            return {
                "active": [f.describe() for f in self.faults],
                "suppressed": list(self.suppressed),
                "requests": self.requests,
            }
