"""Fidelity diff: one observation sequence against the real SGLang server and the simulator, then the differences.

Sections `tp1` and `tp2` launch the real SGLang 0.5.23 (CPU, the tiny scripted model of the real-serving tier) and
`simulator.launch_server` with the same model path at that tp size, and record what the supervisor relies on:
process titles, endpoint status codes, `/health` timing when idle, metric names and label sets, normalised log lines
of startup; then what `/pause_generation` in each mode does with a request decoding (`/ready`, `/ping`, the gauges,
the token counter, the memory release and resume, `/continue_generation`); then, on tp 1, what SIGKILL of the
scheduler does (main exit code and its teardown lines), and on tp >= 2, what SIGSTOP of `scheduler_TP1` with a
request in flight does (`/health` code and time, running gauge, token counter). Section `pd` runs the real prefill
and decode over Mooncake/TCP against the simulated pair (`benchmarks/fidelity_pd.py` says what it records), section
`dp2` one server at `--dp-size 2` (`benchmarks/fidelity_dp.py`), section `reqlog` SGLang's JSON request log
(`benchmarks/fidelity_reqlog.py`).
It prints the differences (and writes the profiles to `benchmarks/results/fidelity.json`). Figures, no verdict:
a difference is either a simulator bug to fix or a deliberate difference written down in benchmarks/README.md.

    .venv/bin/python -m benchmarks.fidelity_diff [--sections tp1 tp2 pd dp2 reqlog] [--sim-only]

Needs the serving venvs and the models (built by the real-serving and real-PD tiers: `make test`). Everything
listens on 127.0.0.1 and every process is killed at the end.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks import fidelity_dp, fidelity_pd, fidelity_reqlog
from benchmarks.common import RESULTS
from benchmarks.fidelity_target import STAMP, Target, gauge, http_call, metric_shapes, normalise
from tests.real_serving.support import SCRIPTED, tiny_models
from tests.support.ports import free_port
from tests.support.real_sglang import real_serving_python

HANG_WATCH_S = 25.0
SECTIONS = ("tp1", "tp2", "pd", "dp2", "reqlog")
SEPARATE = {
    "pd": fidelity_pd,
    "dp2": fidelity_dp,
    "reqlog": fidelity_reqlog,
}  # sections with a module of their own
ENDPOINTS: tuple[tuple[str, str, dict[str, Any] | None], ...] = (
    ("GET", "/health", None),
    ("GET", "/health_generate", None),
    ("GET", "/metrics", None),
    ("GET", "/server_info", None),
    ("GET", "/get_server_info", None),
    ("GET", "/model_info", None),
    ("GET", "/v1/models", None),
    ("GET", "/no_such_path", None),
    ("POST", "/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 4}}),
    (
        "POST",
        "/v1/chat/completions",
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
    ),
    ("POST", "/v1/chat/completions", {"model": "m", "messages": "not a list"}),
)


def diff_profiles(real: dict[str, Any], sim: dict[str, Any], prefix: str = "") -> list[str]:
    """The differences between two profiles, one line each (`key: real=… sim=…`, set differences by element)."""
    lines: list[str] = []
    for key in sorted(set(real) | set(sim)):
        where = f"{prefix}{key}"
        a, b = real.get(key), sim.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            lines += diff_profiles(a, b, where + ".")
        elif isinstance(a, list) and isinstance(b, list) and all(isinstance(x, str) for x in a + b):
            only_real, only_sim = sorted(set(a) - set(b)), sorted(set(b) - set(a))
            lines += [f"{where}: only real: {x}" for x in only_real]
            lines += [f"{where}: only sim: {x}" for x in only_sim]
        elif a != b:
            lines.append(f"{where}: real={json.dumps(a)} sim={json.dumps(b)}")
    return lines


def _in_flight(url: str) -> threading.Thread:
    body = {"text": "hello", "sampling_params": {"max_new_tokens": 3000, "ignore_eos": True}}
    thread = threading.Thread(target=http_call, args=("POST", url + "/generate", body, 300), daemon=True)
    thread.start()
    return thread


def observe(target: Target, tp: int) -> dict[str, Any]:
    """The whole observation sequence on one target; leaves it killed."""
    try:
        profile: dict[str, Any] = {"timing": target.wait_ready(), "titles": target.titles()}
        http_call("POST", target.url + "/generate", ENDPOINTS[8][2], 120)
        _, health_s, _ = http_call("GET", target.url + "/health", None, 30)
        profile["timing"]["health_idle_s"] = round(health_s, 1)
        profile["endpoints"] = {
            f"{m} {p}#{i}": http_call(m, target.url + p, b, 120)[0] for i, (m, p, b) in enumerate(ENDPOINTS)
        }
        profile["metrics"] = metric_shapes(http_call("GET", target.url + "/metrics", None, 30)[2])
        profile["startup_log"] = sorted({normalise(x) for x in target.log_lines() if STAMP.match(x)})
        profile["pause"] = {mode: _pause(target, mode) for mode in ("abort", "retract", "in_place")}
        profile["fault"] = _hang(target) if tp >= 2 else _rank_kill(target)
        return profile
    finally:
        target.kill()


def _rank_kill(target: Target) -> dict[str, Any]:
    """SIGKILL the scheduler: how the main process reacts and what it logs."""
    mark = len(target.log_lines())
    target.rank("sglang::scheduler").kill()
    start = time.monotonic()
    try:
        code = target.proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        code = None
    return {
        "main_exit_code": code,
        "main_exit_s": round(time.monotonic() - start),
        "teardown_log": sorted({normalise(x) for x in target.log_lines()[mark:] if x.strip()}),
    }


def _hang(target: Target) -> dict[str, Any]:
    """SIGSTOP scheduler_TP1 with a request decoding: /health, the running gauge, the token counter."""
    _in_flight(target.url)
    deadline = time.monotonic() + 120
    while gauge(target.url, "sglang:num_running_reqs") < 1 and time.monotonic() < deadline:
        time.sleep(0.2)
    target.rank("sglang::scheduler_TP1").suspend()
    time.sleep(2.0)  # let the batch in progress reach the collective
    tokens = gauge(target.url, "sglang:realtime_tokens_total")
    code, health_s, _ = http_call("GET", target.url + "/health", None, HANG_WATCH_S + 10)
    return {
        "health_code": code,
        "health_s": round(health_s),
        "running_reqs": gauge(target.url, "sglang:num_running_reqs"),
        "tokens_frozen": gauge(target.url, "sglang:realtime_tokens_total") == tokens,
    }


def _pause(target: Target, mode: str) -> dict[str, Any]:
    """`/pause_generation` in `mode` with a request decoding: the codes and counters the engine probe reads."""
    _in_flight(target.url)
    deadline = time.monotonic() + 120
    while gauge(target.url, "sglang:num_running_reqs") < 1 and time.monotonic() < deadline:
        time.sleep(0.2)
    code, _, body = http_call("POST", target.url + "/pause_generation", {"mode": mode}, 60)
    time.sleep(1.0)
    tokens = gauge(target.url, "sglang:realtime_tokens_total")
    seen = {
        "pause": [code, body.strip()],
        "ready": http_call("GET", target.url + "/ready", None, 10)[0],
        "ping": http_call("GET", target.url + "/ping", None, 10)[0],
        "running_reqs": gauge(target.url, "sglang:num_running_reqs"),
        "queue_reqs": gauge(target.url, "sglang:num_queue_reqs"),
        "pause_responses": gauge(target.url, "sglang:http_responses_total") > 0,
    }
    time.sleep(2.0)
    seen["tokens_frozen"] = gauge(target.url, "sglang:realtime_tokens_total") == tokens
    release = http_call("POST", target.url + "/release_memory_occupation", {}, 60)
    seen["release"] = [release[0], release[2].strip()]
    resumed = http_call("POST", target.url + "/resume_memory_occupation", {}, 60)
    seen["resume"] = [resumed[0], resumed[2].strip()]
    code, _, body = http_call("POST", target.url + "/continue_generation", {}, 60)
    seen["continue"] = [code, body.strip()]
    seen["ready_after"] = http_call("GET", target.url + "/ready", None, 10)[0]
    http_call("POST", target.url + "/abort_request", {"abort_all": True}, 30)
    return seen


def _argv(python: str, module: str, model: Path, tp: int, port: int, real: bool) -> list[str]:
    argv = [python, "-m", module, "--model-path", str(model), "--tp-size", str(tp), "--port", str(port)]
    argv += ["--host", "127.0.0.1", "--enable-metrics", "--tool-call-parser", "qwen", "--attention-backend"]
    argv += ["torch_native", "--mem-fraction-static", "0.05", "--max-total-tokens", "4096"]
    return argv + (["--device", "cpu", "--load-format", "safetensors"] if real else [])


def run(sections: list[str], sim_only: bool) -> dict[str, Any]:
    """Profiles of both worlds per section (`tp1`, `tp2`: one server at that tp size; `pd`: the pair), the real
    one skipped with `sim_only`."""
    python = real_serving_python()
    model = tiny_models(python) / SCRIPTED
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="sglsup-fidelity-") as tmp:
        work = Path(tmp)
        for section in sections:
            if section in SEPARATE:
                out[section] = SEPARATE[section].profiles(sim_only, work)
                continue
            tp = int(section.removeprefix("tp"))
            sim_env = {
                "SGLANG_SIM_STATE_DIR": str(work / f"sim{tp}"),
                "SGLANG_SIM_SHM_DIR": str(work / f"shm{tp}"),
            }
            port = free_port(3)
            sim = Target(
                "sim",
                _argv(sys.executable, "simulator.launch_server", model, tp, port, False),
                sim_env,
                port,
                work,
            )
            out[section] = {"sim": observe(sim, tp)}
            if not sim_only:
                env = {"SGLANG_CPU_OMP_THREADS_BIND": "|".join(str(i) for i in range(tp))} if tp > 1 else {}
                port = free_port(3)
                real = Target(
                    "real", _argv(str(python), "sglang.launch_server", model, tp, port, True), env, port, work
                )
                out[section]["real"] = observe(real, tp)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sections", nargs="+", choices=SECTIONS, default=list(SECTIONS))
    parser.add_argument("--sim-only", action="store_true", help="profile the simulator only (no real server)")
    args = parser.parse_args()
    profiles = run(args.sections, args.sim_only)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "fidelity.json").write_text(json.dumps(profiles, indent=1))
    for section, both in profiles.items():
        print(f"== {section}")
        if "real" not in both:
            print(json.dumps(both["sim"], indent=1))
            continue
        for line in diff_profiles(both["real"], both["sim"]):
            print("  " + line)


if __name__ == "__main__":
    main()
