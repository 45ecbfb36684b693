"""One simulated GPU host with a server per alert cause, run by the installed daemon, as the monitoring tier and
benchmarks/bench_prometheus.py drive it (tests/support/alert_causes.py injects the faults).

Each server owns its GPUs and ports, so the faults injected into them at the same time do not interfere:

| server | cause | alerts |
|---|---|---|
| `wedge` (tp 2) | a TP desync hang (F1, live) | SglangWedgeDetected |
| `crashy` | a CUDA OOM at every launch until the operator fixes it | SglangServerCrashLoop, SglangServerFailed |
| `parser` | launched without `--tool-call-parser` (fixed by the supervisor) | SglangParserMisconfigured |
| `leaky` | tool markup leaking into streams under load (F16, live; 16 concurrent stream canaries) | SglangServerDegraded |
| `slowcanary` | a model too slow for the canary's timeout (reload raises it) | SglangCanaryUnproven |
| `gpu` | a fatal Xid 79 (F9 with `xid = 79`: fallen off the bus), the card replaced | SglangGpuFault |
| `slowstart` | a 40 s DeepGEMM JIT startup (F15), twice the shortened `for:` | SglangServerDown |

The daemon-wide causes (a full state_dir, a webhook that refuses, the daemon stopped) need no server of their own.
The restart budget is 3 restarts (backoff 1 s, 2 s, 4 s after an immediate first), so the crash loop ends
`failed` within seconds.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.daemon import Deployment, q, toml_value
from tests.support.ports import free_port
from tests.support.treewatch import TreeWatch
from tests.support.wheel import Installed

MODEL = "moonshotai/Kimi-K2.5"
PARSERS = ["--tool-call-parser", "kimi_k2", "--reasoning-parser", "kimi_k2"]
BASE_PROBES: dict[str, Any] = {
    "health_period_s": 1,
    "canary_period_s": 5,
    "metrics_period_s": 1,
    "stall_after_s": 6,
    "stream_canary_period_s": 0,
}
# F16 leaks from the 2nd concurrent stream on, each with probability 1/2: one of 15 leaks in all but 1 of 2^15
# stream canaries, so the degraded state lasts; no routine canary after the first, which would run among the
# streams, leak too and be taken for a parser misconfiguration.
LEAK_STREAMS = 16
SLOW_START_S = 40  # SglangServerDown's for: of 10 minutes is 20 s in the test's rules, at a 1 s scrape


@dataclass
class ServerSpec:
    """One simulated server of the host: its GPUs, launch flags, environment and probe settings."""

    name: str
    gpus: tuple[int, ...]
    args: list[str] = field(default_factory=lambda: list(PARSERS))
    env: dict[str, str] = field(default_factory=dict)
    probes: dict[str, Any] = field(default_factory=dict)
    port: int = field(default_factory=lambda: free_port(3))

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def servers(root: Path) -> list[ServerSpec]:
    """The host's servers; `root` holds the scenario files of those armed at launch."""
    return [
        ServerSpec("wedge", (0, 1)),
        ServerSpec("crashy", (2,), env={"SGLANG_SIM_SCENARIO": str(root / "crashy.toml")}),
        ServerSpec("parser", (3,), args=["--reasoning-parser", "kimi_k2"]),
        ServerSpec(
            "leaky",
            (4,),
            probes={
                "canary_period_s": 3600,
                "stream_canary_concurrency": LEAK_STREAMS,
                "stream_canary_period_s": 2,
                "stream_canary_first_s": 1,
            },
        ),
        ServerSpec(
            "slowcanary",
            (5,),
            env={"SGLANG_SIM_STEP_S": "0.1"},
            probes={"canary_period_s": 2, "canary_timeout_s": 1, "canary_inconclusive_limit": 3},
        ),
        ServerSpec("gpu", (6,)),
        ServerSpec("slowstart", (7,), env={"SGLANG_SIM_SCENARIO": str(root / "slowstart.toml")}),
    ]


@dataclass
class AlertingHost(Deployment):
    """The installed daemon over `servers(root)`, its state_dir on a file system the test can fill, its alerts
    to a webhook, its servers launched by the installed simulator."""

    installed: Installed | None = None
    webhook_url: str = ""
    restart: dict[str, float] = field(
        default_factory=lambda: {"restarts": 3, "initial_s": 1, "factor": 2, "max_s": 4, "jitter": 0}
    )
    specs: list[ServerSpec] = field(default_factory=list)
    slow_start_s: float = SLOW_START_S  # the `slowstart` server's load

    def write(self) -> None:
        if not self.specs:
            self.specs = servers(self.root)
            (self.root / "crashy.toml").write_text("")
            (self.root / "slowstart.toml").write_text(
                f'[[fault]]\nname = "slow_startup_deepgemm"\non_start = true\n[fault.params]\nstartup_s = {self.slow_start_s}\n'
            )
        assert self.installed is not None
        (self.root / "webhook.url").write_text(self.webhook_url + "\n")
        lines = self.supervisor_lines()
        for spec in self.specs:
            args = ["--model-path", MODEL, "--tp-size", str(len(spec.gpus)), "--enable-metrics"]
            args += ["--port", str(spec.port), *spec.args]
            env = {**self.sim_env(), **spec.env}
            lines += [
                "[[servers]]",
                f"name = {q(spec.name)}",
                f"command = {json.dumps([str(self.installed.python), '-m', 'simulator.launch_server'])}",
                f"args = {json.dumps(args)}",
                f"gpus = {list(spec.gpus)}",
                f"gpu_device_paths = {json.dumps([str(d) for d in self.gpu_devices(spec)])}",
                f"ports = [{spec.port + 2}]",
                "startup_budget_s = 120",
                "startup_silence_s = 60",
                "drain_grace_s = 5",
                "[servers.env]",
                *(f"{k} = {q(v)}" for k, v in env.items()),
                "[servers.probes]",
                *(f"{k} = {toml_value(v)}" for k, v in {**BASE_PROBES, **spec.probes}.items()),
            ]
        lines += [
            "[alerts]",
            "rate_limit_per_min = 600",
            "retries = 1",
            "timeout_s = 2",
            "[alerts.webhook]",
            f"url_file = {q(str(self.root / 'webhook.url'))}",
        ]
        self.config_path.write_text("\n".join(lines) + "\n")

    def gpu_devices(self, spec: ServerSpec) -> list[Path]:
        """The stand-in device files of a server's GPUs."""
        return [self.sim / "dev" / f"nvidia{g}" for g in spec.gpus]

    def spec(self, name: str) -> ServerSpec:
        """The server called `name`."""
        return next(s for s in self.specs if s.name == name)

    def server_names(self) -> list[str]:
        return [s.name for s in self.specs]

    def device_map(self) -> dict[str, list[Path]]:
        return {s.name: self.gpu_devices(s) for s in self.specs}

    def start(self) -> subprocess.Popen[bytes]:
        """Start the installed `sglang-supervisor run` outside the checkout, logs to daemon.log."""
        assert self.installed is not None
        if self.watch is None:
            self.watch = TreeWatch(self.server_names(), self.root / "state", self.device_map())
        with open(self.root / "daemon.log", "ab") as log:
            self.daemon = subprocess.Popen(
                [str(self.installed.bin / "sglang-supervisor"), "run", "--config", str(self.config_path)],
                cwd=self.root,
                env=self.installed.env(),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return self.daemon
