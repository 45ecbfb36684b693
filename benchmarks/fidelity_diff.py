"""Fidelity diff: one observation sequence against the real SGLang server and the simulator, then the differences.

For each tp size it launches the real SGLang 0.5.23 (CPU, the tiny scripted model of the real-serving tier) and
`simulator.launch_server` with the same model path, and records what the supervisor relies on: process titles,
endpoint status codes, `/health` timing when idle, metric names and label sets, normalised log lines of startup;
then what `/pause_generation` in each mode does with a request decoding (`/ready`, `/ping`, the gauges, the token
counter, the memory release and resume, `/continue_generation`); then, on tp 1, what SIGKILL of the scheduler does
(main exit code and its teardown lines), and on tp >= 2, what SIGSTOP of `scheduler_TP1` with a request in flight
does (`/health` code and time, running gauge, token counter).
It prints the differences (and writes both profiles to `benchmarks/results/fidelity.json`). Figures, no verdict:
a difference is either a simulator bug to fix or a deliberate difference written down in benchmarks/README.md.

    .venv/bin/python -m benchmarks.fidelity_diff [--tp 1 2] [--sim-only]

Needs the serving venv and the models (built by the real-serving tier: `make test`, or
`pytest tests/real_serving -k tp2_serves`). Everything listens on 127.0.0.1 and every process is killed at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import psutil

from benchmarks.common import RESULTS
from tests.real_serving.support import SCRIPTED, tiny_models
from tests.support.daemon import ROOT
from tests.support.ports import free_port
from tests.support.real_sglang import real_serving_python

READY_S = 900.0
HANG_WATCH_S = 25.0
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
_STAMP = re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?: [A-Z0-9_]+)?\] ")
_NUMBER = re.compile(r"\d+(?:\.\d+)?")
_PATHISH = re.compile(r"/[\w./-]+")


def normalise(line: str) -> str:
    """A log line without its timestamp prefix, with numbers as N and paths as P (so runs compare)."""
    text = _STAMP.sub("", line.strip())
    return _NUMBER.sub("N", _PATHISH.sub("P", text))[:160]


def metric_shapes(text: str) -> dict[str, list[str]]:
    """`{metric name: sorted label names}` for every `sglang:` sample of an exposition."""
    out: dict[str, set[str]] = {}
    for line in text.splitlines():
        if not line.startswith("sglang:"):
            continue
        name, _, rest = line.partition("{")
        labels = re.findall(r'(\w+)="', rest.partition("}")[0]) if rest else []
        base = re.sub(r"_(bucket|sum|count|total|created)$", "", name.split(" ")[0])
        out.setdefault(base, set()).update(labels)
    return {k: sorted(v) for k, v in sorted(out.items())}


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


def _http(
    method: str, url: str, body: dict[str, Any] | None, timeout: float
) -> tuple[int | None, float, str]:
    start = time.monotonic()
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, time.monotonic() - start, resp.read(1 << 20).decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, time.monotonic() - start, ""
    except (OSError, urllib.error.URLError):
        return None, time.monotonic() - start, ""


class Target:
    """One launched server (real or simulated): its process, its log, its URL."""

    def __init__(self, kind: str, argv: list[str], env: dict[str, str], port: int, work: Path) -> None:
        self.kind, self.port, self.log_path = kind, port, work / f"{kind}.log"
        self.url = f"http://127.0.0.1:{port}"
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                argv,
                cwd=ROOT,
                env={**os.environ, **env},
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.started = time.monotonic()

    def log_lines(self) -> list[str]:
        return self.log_path.read_text(errors="replace").splitlines()

    def titles(self) -> list[str]:
        """Titles of the tree's processes (`sglang::…`, and `resource_tracker` for that helper)."""
        out = set()
        for child in psutil.Process(self.proc.pid).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                line = " ".join(child.cmdline())
                out.add("resource_tracker" if "resource_tracker" in line else line.split(" ")[0])
        return sorted(out)

    def rank(self, title: str) -> psutil.Process:
        for child in psutil.Process(self.proc.pid).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                if " ".join(child.cmdline()).split(" ")[0] == title:
                    return child
        raise LookupError(f"no {title} under {self.proc.pid}")

    def wait_ready(self) -> dict[str, float | None]:
        """Seconds to the port open and to the first /health 200."""
        opened = ready = None
        deadline = self.started + READY_S
        while time.monotonic() < deadline and self.proc.poll() is None:
            code, _, _ = _http("GET", self.url + "/health", None, 30)
            now = time.monotonic() - self.started
            opened = opened if opened is not None or code is None else now
            if code == 200:
                ready = now
                break
            time.sleep(0.5)
        if ready is None:
            raise RuntimeError(f"{self.kind} not ready: {self.log_lines()[-20:]}")
        return {"port_open_s": opened, "ready_s": ready}

    def kill(self) -> None:
        with contextlib.suppress(psutil.Error):
            tree = [psutil.Process(self.proc.pid), *psutil.Process(self.proc.pid).children(recursive=True)]
            for proc in tree:
                with contextlib.suppress(psutil.Error):
                    proc.kill()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)


def _in_flight(url: str) -> threading.Thread:
    body = {"text": "hello", "sampling_params": {"max_new_tokens": 3000, "ignore_eos": True}}
    thread = threading.Thread(target=_http, args=("POST", url + "/generate", body, 300), daemon=True)
    thread.start()
    return thread


def _gauge(url: str, name: str) -> float:
    _, _, text = _http("GET", url + "/metrics", None, 30)
    return sum(float(x.rsplit(" ", 1)[1]) for x in text.splitlines() if x.startswith(name + "{"))


def observe(target: Target, tp: int) -> dict[str, Any]:
    """The whole observation sequence on one target; leaves it killed."""
    try:
        profile: dict[str, Any] = {"timing": target.wait_ready(), "titles": target.titles()}
        _http("POST", target.url + "/generate", ENDPOINTS[8][2], 120)
        _, health_s, _ = _http("GET", target.url + "/health", None, 30)
        profile["timing"]["health_idle_s"] = round(health_s, 1)
        profile["endpoints"] = {
            f"{m} {p}#{i}": _http(m, target.url + p, b, 120)[0] for i, (m, p, b) in enumerate(ENDPOINTS)
        }
        profile["metrics"] = metric_shapes(_http("GET", target.url + "/metrics", None, 30)[2])
        profile["startup_log"] = sorted({normalise(x) for x in target.log_lines() if _STAMP.match(x)})
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
    while _gauge(target.url, "sglang:num_running_reqs") < 1 and time.monotonic() < deadline:
        time.sleep(0.2)
    target.rank("sglang::scheduler_TP1").suspend()
    time.sleep(2.0)  # let the batch in progress reach the collective
    tokens = _gauge(target.url, "sglang:realtime_tokens_total")
    code, health_s, _ = _http("GET", target.url + "/health", None, HANG_WATCH_S + 10)
    return {
        "health_code": code,
        "health_s": round(health_s),
        "running_reqs": _gauge(target.url, "sglang:num_running_reqs"),
        "tokens_frozen": _gauge(target.url, "sglang:realtime_tokens_total") == tokens,
    }


def _pause(target: Target, mode: str) -> dict[str, Any]:
    """`/pause_generation` in `mode` with a request decoding: the codes and counters the engine probe reads."""
    _in_flight(target.url)
    deadline = time.monotonic() + 120
    while _gauge(target.url, "sglang:num_running_reqs") < 1 and time.monotonic() < deadline:
        time.sleep(0.2)
    code, _, body = _http("POST", target.url + "/pause_generation", {"mode": mode}, 60)
    time.sleep(1.0)
    tokens = _gauge(target.url, "sglang:realtime_tokens_total")
    seen = {
        "pause": [code, body.strip()],
        "ready": _http("GET", target.url + "/ready", None, 10)[0],
        "ping": _http("GET", target.url + "/ping", None, 10)[0],
        "running_reqs": _gauge(target.url, "sglang:num_running_reqs"),
        "queue_reqs": _gauge(target.url, "sglang:num_queue_reqs"),
        "pause_responses": _gauge(target.url, "sglang:http_responses_total") > 0,
    }
    time.sleep(2.0)
    seen["tokens_frozen"] = _gauge(target.url, "sglang:realtime_tokens_total") == tokens
    release = _http("POST", target.url + "/release_memory_occupation", {}, 60)
    seen["release"] = [release[0], release[2].strip()]
    resumed = _http("POST", target.url + "/resume_memory_occupation", {}, 60)
    seen["resume"] = [resumed[0], resumed[2].strip()]
    code, _, body = _http("POST", target.url + "/continue_generation", {}, 60)
    seen["continue"] = [code, body.strip()]
    seen["ready_after"] = _http("GET", target.url + "/ready", None, 10)[0]
    _http("POST", target.url + "/abort_request", {"abort_all": True}, 30)
    return seen


def _argv(python: str, module: str, model: Path, tp: int, port: int, real: bool) -> list[str]:
    argv = [python, "-m", module, "--model-path", str(model), "--tp-size", str(tp), "--port", str(port)]
    argv += ["--host", "127.0.0.1", "--enable-metrics", "--tool-call-parser", "qwen", "--attention-backend"]
    argv += ["torch_native", "--mem-fraction-static", "0.05", "--max-total-tokens", "4096"]
    return argv + (["--device", "cpu", "--load-format", "safetensors"] if real else [])


def run(tps: list[int], sim_only: bool) -> dict[str, Any]:
    """Profiles of both worlds per tp size (the real one skipped with `sim_only`)."""
    python = real_serving_python()
    model = tiny_models(python) / SCRIPTED
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="sglsup-fidelity-") as tmp:
        work = Path(tmp)
        for tp in tps:
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
            out[f"tp{tp}"] = {"sim": observe(sim, tp)}
            if not sim_only:
                env = {"SGLANG_CPU_OMP_THREADS_BIND": "|".join(str(i) for i in range(tp))} if tp > 1 else {}
                port = free_port(3)
                real = Target(
                    "real", _argv(str(python), "sglang.launch_server", model, tp, port, True), env, port, work
                )
                out[f"tp{tp}"]["real"] = observe(real, tp)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tp", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--sim-only", action="store_true", help="profile the simulator only (no real server)")
    args = parser.parse_args()
    profiles = run(args.tp, args.sim_only)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "fidelity.json").write_text(json.dumps(profiles, indent=1))
    for tp, both in profiles.items():
        print(f"== {tp}")
        if "real" not in both:
            print(json.dumps(both["sim"], indent=1))
            continue
        for line in diff_profiles(both["real"], both["sim"]):
            print("  " + line)


if __name__ == "__main__":
    main()
