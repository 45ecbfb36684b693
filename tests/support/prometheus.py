"""A real Prometheus and a real Alertmanager (Debian's, extracted by tests/support/tools.py) on loopback ports,
configured from the packaged files as a user would, for the monitoring tier and benchmarks/bench_prometheus.py.

The rewrites of the packaged files are the only liberties taken, each named here:

- `scrape_config`: the packaged `prometheus.yml` with its targets, intervals (global scrape and evaluation
  interval; a job's own interval or timeout dropped), rule file and Alertmanager replaced; its jobs (names and
  everything else) are kept.
- `accelerated_rules`: the packaged `alerts.yaml` with every `for:` read as 2 seconds a minute (`for: 10m` →
  `for: 20s`, 30 times faster), so that a rule whose alert needs a state to last fires in a run of minutes.
  Nothing else of a rule changes: expressions and their windows, thresholds, labels and annotations stay
  byte for byte (`rules_differ_only_in_for` checks it). A rule over a window of events (`increase(…[30m])`)
  therefore stays firing for the rest of the run; tests/support/recorded.py shows it resolving.
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.support.ports import free_port
from tests.support.tools import ensure_alertmanager, ensure_prometheus
from tests.support.wait import wait_for

SUPERVISOR_JOB = "sglang-supervisor"
SGLANG_JOB = "sglang"
_FOR = re.compile(r"^(\s+for: )(\d+)m$", re.MULTILINE)
FOR_S_PER_MINUTE = 2  # the accelerated rules' `for:`: 2 s for each minute of the packaged one
_STOP_S = 10.0
_SPAN_GAP_S = 2.5  # seconds without a firing sample that end a span (the queries step by 1 s)


def accelerated_rules(text: str) -> str:
    """The rules with each `for:` of N minutes made 2·N seconds; nothing else changed."""
    return _FOR.sub(lambda m: f"{m.group(1)}{int(m.group(2)) * FOR_S_PER_MINUTE}s", text)


def _masked(text: str) -> str:
    return re.sub(r"^(\s+for: )\d+[sm]$", r"\g<1>D", text, flags=re.MULTILINE)


def rules_differ_only_in_for(packaged: str, rewritten: str) -> bool:
    """True when the two rule files are the same text once every `for:` duration is masked."""
    return _masked(packaged) == _masked(rewritten)


def rule_for_s(rule: dict[str, Any]) -> float:
    """A rule's `for:` in seconds (0 without one); Prometheus durations like 90s, 5m, 1h."""
    value = str(rule.get("for", "0s"))
    match = re.fullmatch(r"(\d+)([smh])", value)
    if match is None:
        raise ValueError(f"unsupported duration {value!r}")
    return float(match.group(1)) * {"s": 1, "m": 60, "h": 3600}[match.group(2)]


def scrape_config(
    packaged: Path,
    *,
    interval_s: float,
    supervisor: list[str],
    sglang: list[str],
    rules: Path,
    alertmanager: str | None,
) -> dict[str, Any]:
    """The packaged scrape example pointed at this run: the targets of its two jobs, the intervals, one rule
    file and one Alertmanager (`host:port`; None: no alerting section). A job the example does not name is an
    error."""
    config: dict[str, Any] = yaml.safe_load(packaged.read_text())
    config["global"] = {
        **config.get("global", {}),
        "scrape_interval": f"{interval_s:g}s",
        "evaluation_interval": f"{interval_s:g}s",
        "scrape_timeout": f"{min(interval_s, 10):g}s",
    }
    config["rule_files"] = [str(rules)]
    if alertmanager is None:
        del config["alerting"]
    else:
        config["alerting"]["alertmanagers"][0]["static_configs"] = [{"targets": [alertmanager]}]
    targets = {SUPERVISOR_JOB: supervisor, SGLANG_JOB: sglang}
    jobs = [job["job_name"] for job in config["scrape_configs"]]
    if sorted(jobs) != sorted(targets):
        raise AssertionError(f"the packaged scrape example has jobs {jobs}, expected {sorted(targets)}")
    for job in config["scrape_configs"]:
        job["static_configs"] = [{"targets": targets[job["job_name"]]}]
        job.pop("scrape_interval", None)
        job.pop("scrape_timeout", None)
    return config


def _get(url: str, timeout: float = 60.0) -> Any:  # a range query on a starved 2-core machine took over 10 s
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return json.loads(resp.read())


def _ready(base: str) -> bool:
    with (
        contextlib.suppress(OSError, urllib.error.URLError),
        urllib.request.urlopen(base + "/-/ready", timeout=2) as resp,
    ):
        return bool(resp.status == 200)
    return False


@dataclass
class _Binary:
    """A server binary run on a loopback port with a config file and a data folder of its own."""

    root: Path
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _config(self, name: str, config: dict[str, Any]) -> Path:
        """`config` written as YAML to `name` in this server's folder."""
        self.root.mkdir(parents=True, exist_ok=True)
        path = self.root / name
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        return path

    def _spawn(self, argv: list[str], cwd: Path | None = None) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        with (self.root / "log").open("ab") as log:
            self.proc = subprocess.Popen(
                argv, cwd=cwd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
            )
        wait_for(lambda: self._up(), 60, f"{argv[0]} on {self.address} to be ready")

    def _up(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise AssertionError(f"{self.root.name} exited {self.proc.returncode}:\n{self.log_tail()}")
        return _ready(self.url)

    def log_tail(self, n: int = 40) -> str:
        path = self.root / "log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:]) if path.exists() else ""

    def stop(self) -> None:
        """Terminate the process this object started (kill it if it does not go)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=_STOP_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=_STOP_S)


@dataclass
class Prometheus(_Binary):
    """Debian's Prometheus server with one config."""

    def start(self, config: dict[str, Any]) -> None:
        path = self._config("prometheus.yml", config)
        self._spawn(
            [
                str(ensure_prometheus()),
                f"--config.file={path}",
                f"--storage.tsdb.path={self.root / 'data'}",
                f"--web.listen-address={self.address}",
                "--log.level=warn",
            ]
        )

    def api(self, path: str, **params: str) -> Any:
        """GET /api/v1/<path>: its `data`."""
        query = urllib.parse.urlencode(params)
        body = _get(f"{self.url}/api/v1/{path}" + (f"?{query}" if query else ""))
        if body.get("status") != "success":
            raise AssertionError(f"{path} {params}: {body}")
        return body["data"]

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        """An instant query's vector (at `at`, Unix seconds, or now)."""
        params = {"query": expr, **({"time": f"{at:.3f}"} if at is not None else {})}
        data = self.api("query", **params)
        return list(data["result"]) if data["resultType"] == "vector" else []

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        """A range query's matrix: [{metric, values: [[t, "v"], …]}, …]."""
        data = self.api("query_range", query=expr, start=f"{start:.3f}", end=f"{end:.3f}", step=f"{step:g}")
        return list(data["result"])

    def samples(self, expr: str, start: float, end: float | None = None) -> list[dict[str, Any]]:
        """Every series of `expr` with its values at each second from `start` to `end` (now)."""
        return self.query_range(expr, start, end or time.time(), 1)

    def firing_spans(
        self, alert: str, labels: Mapping[str, str], start: float, end: float | None = None
    ) -> list[tuple[float, float]]:
        """The spans (first, last second) in which `alert` with `labels` was firing, from the ALERTS series."""
        matchers = [f'alertname="{alert}"', 'alertstate="firing"', *(f'{k}="{v}"' for k, v in labels.items())]
        found = self.samples("ALERTS{" + ",".join(matchers) + "}", start, end)
        times = sorted({float(t) for series in found for t, _ in series["values"]})
        spans: list[tuple[float, float]] = []
        for t in times:
            if spans and t - spans[-1][1] <= _SPAN_GAP_S:
                spans[-1] = (spans[-1][0], t)
            else:
                spans.append((t, t))
        return spans

    def alerts(self) -> list[dict[str, Any]]:
        """The alerts pending or firing now."""
        return list(self.api("alerts")["alerts"])

    def rule_groups(self) -> list[dict[str, Any]]:
        """The loaded rule groups, with each rule's state and health."""
        return list(self.api("rules")["groups"])

    def targets(self) -> list[dict[str, Any]]:
        """The active scrape targets."""
        return list(self.api("targets")["activeTargets"])


@dataclass
class Alertmanager(_Binary):
    """Debian's Alertmanager, clustering off, with one config."""

    def start(self, config: dict[str, Any]) -> None:
        path = self._config("alertmanager.yml", config)
        binary = ensure_alertmanager()
        self._spawn(
            [
                str(binary),
                f"--config.file={path}",
                f"--storage.path={self.root / 'data'}",
                f"--web.listen-address={self.address}",
                "--cluster.listen-address=",
                "--log.level=warn",
            ],
            cwd=binary.parents[2],
        )
