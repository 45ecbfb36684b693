"""The real PD pair under the daemon: a prefill and a decode of the real SGLang 0.5.23 on CPU (the shipped
`examples/pd-1p1d.toml` shape with the CPU flags of `reference/real-pd.md`), the KV over Mooncake's TCP transport,
and the real SMG in PD mode as the `[gateway]` the daemon drives."""

from __future__ import annotations

import contextlib
import json
import random
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from tests.real_serving.support import PROBES, READY_S, SCRIPTED, one_real_server_at_a_time
from tests.support.daemon import Deployment, checked, q
from tests.support.gateways import ADMIN_KEY, Gateway, running_gateway
from tests.support.http import http
from tests.support.ports import free_port
from tests.support.real_pd import library_path

COMMON = [
    "--device", "cpu", "--attention-backend", "torch_native", "--mem-fraction-static", "0.05",
    "--max-total-tokens", "4096", "--enable-metrics", "--tool-call-parser", "qwen",
    "--disaggregation-transfer-backend", "mooncake",
]  # fmt: skip
PREFILL_CPU = ["--disable-overlap-schedule"]  # two CUDA-only calls otherwise (real-pd.md)
DECODE_CPU = ["--disaggregation-decode-retraction-backup", "cpu_tensor"]
MOONCAKE_ENV = {"SGLANG_HOST_IP": "127.0.0.1", "MOONCAKE_PROTOCOL": "tcp", "MC_FORCE_TCP": "1"}
LONG_PROMPT = (
    "weather Paris sunny servers GPUs story " * 150
)  # 3605 tokens: + 512 reserved > the 3625-token pool
# The real tier's fast probes, scraping every 2 s and asking /health every 5 s: two real servers answer them beside
# make test's parallel workers (a scrape with work in flight still comes every 1-2 s, policies unchanged).
PD_PROBES = {**PROBES, "metrics_period_s": 2, "health_period_s": 5}


@dataclass
class RealPdDeployment(Deployment):
    """The real prefill (`prefill`) and decode (`decode`) under one daemon, SMG in PD mode in front."""

    python: Path = Path()
    models: Path = Path()
    gateway: Gateway | None = None
    gateway_lines: list[str] = field(default_factory=list)

    @property
    def model_dir(self) -> Path:
        return self.models / SCRIPTED

    def write(self) -> None:
        self.tp = 1
        self.boot, self.decode_port = free_port(), free_port()
        rpc = free_port(100)  # Mooncake's handshake and transport ports, kept inside a block of ours
        env = {
            "SGLANG_SIM_STATE_DIR": str(self.sim),  # unique to the test: cleanup finds our processes by it
            "LD_LIBRARY_PATH": library_path(),
            **MOONCAKE_ENV,
            "MC_MIN_RPC_PORT": str(rpc),
            "MC_MAX_RPC_PORT": str(rpc + 99),
            **self.env,
        }
        common = ["--model-path", str(self.model_dir), "--host", "127.0.0.1", *COMMON]
        servers = [
            ("prefill", self.port, [*PREFILL_CPU, "--disaggregation-mode", "prefill",
             "--disaggregation-bootstrap-port", str(self.boot), "--nccl-port", str(free_port())],
             {"SGLANG_DISAGGREGATION_ALL_CP_RANKS_TRANSFER": "1"}),
            ("decode", self.decode_port, [*DECODE_CPU, "--disaggregation-mode", "decode",
             "--nccl-port", str(free_port())], {}),
        ]  # fmt: skip
        lines = [*(line.replace('"sim"', '"none"') for line in self.supervisor_lines()), *self.gateway_lines]
        for name, port, args, own in servers:
            lines += [
                "[[servers]]",
                f"name = {q(name)}",
                f"role = {q(name)}",
                f"command = {json.dumps([str(self.python), '-m', 'sglang.launch_server'])}",
                f"args = {json.dumps([*common, '--port', str(port), *args])}",
                f"startup_budget_s = {READY_S}",
                f"startup_silence_s = {READY_S}",
                "drain_grace_s = 20",
                "[servers.env]",
                *(f"{k} = {q(v)}" for k, v in {**env, **own}.items()),
                "[servers.probes]",
                *(f"{k} = {json.dumps(v)}" for k, v in {**PD_PROBES, **self.probes}.items()),
            ]
        self.config_path.write_text("\n".join(lines) + "\n")

    def server_names(self) -> list[str]:
        return ["prefill", "decode"]

    @property
    def urls(self) -> dict[str, str]:
        return {"prefill": self.sim_url, "decode": f"http://127.0.0.1:{self.decode_port}"}

    def named(self, name: str) -> dict[str, Any]:
        return self.servers()[name]

    def ranks(self, name: str) -> dict[str, psutil.Process]:
        """The named server's SGLang processes under its main, by title (`sglang::scheduler`, ...)."""
        out = {}
        for child in psutil.Process(self.named(name)["pid"]).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                title = " ".join(child.cmdline())
                if title.startswith("sglang::"):
                    out[title.split()[0]] = child
        return out

    def incidents(self) -> list[dict[str, Any]]:
        """The incident journal, oldest first (`/incidents` pages it newest first)."""
        with urllib.request.urlopen(self.url + "/incidents?limit=500", timeout=5) as resp:
            data = json.loads(resp.read())
        return list(reversed(data["incidents"] if isinstance(data, dict) else data))

    def events(self, name: str) -> list[dict[str, Any]]:
        """The daemon's log events called `name`."""
        out = []
        for line in (self.root / "daemon.log").read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                event = json.loads(line)
                if event.get("event") == name:
                    out.append(event)
        return out


@contextlib.contextmanager
def real_pd_deployment(root: Path, python: Path, models: Path, **kw: Any) -> Iterator[RealPdDeployment]:
    """The pair behind SMG in PD mode (the daemon drives its membership); cleaned up on every exit path."""
    (root / "gateway-key").write_text(ADMIN_KEY + "\n")
    with one_real_server_at_a_time(), running_gateway("smg", root, extra=["--pd-disaggregation"]) as gw:
        lines = ["[gateway]", f"url = {q(gw.url)}", f"admin_key_file = {q(str(root / 'gateway-key'))}"]
        dep = RealPdDeployment(root, python=python, models=models, gateway_lines=lines, **kw)
        dep.gateway = gw
        with checked(dep):
            yield dep


def both_serving(servers: dict[str, dict[str, Any]]) -> bool:
    return all(servers[n]["state"] == "serving" for n in ("prefill", "decode"))


class Chats:
    """`n` clients sending short chat completions through the gateway in a loop until closed; each outcome kept
    as (start, end, status) — status 0 for a request that got no HTTP answer."""

    def __init__(self, url: str, model: str, n: int = 2, timeout_s: float = 120) -> None:
        self.url, self.model, self.timeout_s = url, model, timeout_s
        self.results: list[tuple[float, float, int]] = []
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._loop, daemon=True) for _ in range(n)]

    def _loop(self) -> None:
        import time

        body = json.dumps(
            {"model": self.model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 24}
        ).encode()
        while not self.stop.is_set():
            start = time.time()
            req = urllib.request.Request(
                self.url + "/v1/chat/completions", data=body, headers={"Content-Type": "application/json"}
            )
            status = 0
            try:
                with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                    resp.read()
                    status = resp.status
            except urllib.error.HTTPError as exc:
                status = exc.code
            except (OSError, ValueError):
                status = 0
            self.results.append((start, time.time(), status))
            if status != 200:
                self.stop.wait(0.5)

    def __enter__(self) -> Chats:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=self.timeout_s + 5)

    def ok(self) -> int:
        return sum(1 for r in self.results if r[2] == 200)


def pd_queue(url: str) -> float:
    """A PD worker's live queue (prealloc + transfer on a decode) from `GET /v1/loads`."""
    with urllib.request.urlopen(url + "/v1/loads", timeout=30) as resp:
        loads = json.loads(resp.read())["loads"]
    keys = ("decode_prealloc_queue_reqs", "decode_transfer_queue_reqs")
    return float(sum((rank.get("disaggregation") or {}).get(k, 0) for rank in loads for k in keys))


def pair_chat(dep: RealPdDeployment, body: dict[str, Any], timeout_s: float) -> int:
    """One chat sent straight to the pair as SGLang's router sends it (no gateway, so no retry): the same body with
    the prefill's bootstrap endpoint and a fresh room to the prefill and the decode at once; the decode's status."""
    room = {
        "bootstrap_host": "127.0.0.1",
        "bootstrap_port": dep.boot,
        "bootstrap_room": random.getrandbits(63),
    }
    with ThreadPoolExecutor(2) as pool:
        halves = [
            pool.submit(http, f"{dep.urls[n]}/v1/chat/completions", "POST", {**body, **room}, timeout_s)
            for n in ("prefill", "decode")
        ]
        return halves[1].result(timeout=timeout_s + 5).status
