"""The daemon supervising a hostile server: it keeps its tick, bounded memory, and raises no false fault."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.support.ports import free_port
from tests.support.wait import wait_for

pytestmark = pytest.mark.hardening

ROOT = Path(__file__).resolve().parents[2]
RSS_BOUND = (
    160 * 2**20
)  # measured: under 60 MiB; reads are capped at 1 MiB per stream (x8 here) and 4 MiB of metrics
WATCH_S = 30.0


def _config(root: Path, mode: str, port: int, http_port: int) -> Path:
    lines = [
        "[supervisor]",
        f"state_dir = {json.dumps(str(root / 'state'))}",
        f"log_dir = {json.dumps(str(root / 'log'))}",
        f"shm_dir = {json.dumps(str(root / 'shm'))}",
        'gpu_backend = "none"',
        "[supervisor.http]",
        f"port = {http_port}",
        "[[servers]]",
        'name = "hostile"',
        f"command = {json.dumps([sys.executable, '-m', 'tests.hardening.hostile'])}",
        f'args = ["--model-path", "Qwen/Qwen3-8B", "--port", "{port}"]',
        "startup_budget_s = 600",
        "startup_silence_s = 600",
        "[servers.env]",
        f'HOSTILE_MODE = "{mode}"',
        'SGLANG_HEALTH_CHECK_TIMEOUT = "3"',
        "[servers.probes]",
        "health_period_s = 1",
        "health_timeout_s = 4",
        "canary_period_s = 2",
        "canary_timeout_s = 4",
        "metrics_period_s = 0.5",
        "stream_canary_concurrency = 8",
        "stream_canary_period_s = 4",
        'expected_tool_parser = "none"',
        'expected_reasoning_parser = "none"',
    ]
    path = root / "config.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


@contextlib.contextmanager
def daemon(root: Path, mode: str) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """The daemon on a config pointing at a hostile server; everything it started is killed after."""
    http_port = free_port()
    config = _config(root, mode, free_port(), http_port)
    with open(root / "daemon.log", "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "supervisor.cli", "run", "--config", str(config)],
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        yield proc, f"http://127.0.0.1:{http_port}"
    finally:
        children = psutil.Process(proc.pid).children(recursive=True) if proc.poll() is None else []
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        for child in children:
            with contextlib.suppress(psutil.Error):
                child.kill()


def _get(url: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, None


def _watch(proc: subprocess.Popen[bytes], url: str, seconds: float) -> dict[str, Any]:
    """Poll /healthz and /status and the daemon's RSS for `seconds` (after it first answers)."""

    def up() -> bool:
        assert proc.poll() is None, "the daemon exited before it answered"
        return _get_quiet(url + "/healthz") is not None

    wait_for(up, 60, "the daemon answering /healthz", interval=0.1)
    seen: dict[str, Any] = {"healthz": [], "rss": [], "ages": [], "status": {}, "failed": set()}
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        assert proc.poll() is None, "the daemon exited"
        code, body = _get(url + "/healthz")
        seen["healthz"].append(code)
        seen["ages"].append((body or {}).get("loop_age_s"))
        seen["rss"].append(psutil.Process(proc.pid).memory_info().rss)
        seen["status"] = _get(url + "/status")[1]
        probes = (seen["status"]["servers"][0].get("probes") or {}).get("probes", {})
        seen["failed"] |= {name for name, p in probes.items() if not p["ok"]}
        time.sleep(0.25)
    return seen


def _get_quiet(url: str) -> int | None:
    with contextlib.suppress(OSError, ValueError):
        return _get(url)[0]
    return None


def test_a_hostile_server_costs_the_daemon_neither_its_tick_nor_its_memory(tmp_path: Path) -> None:
    """Every endpoint lies in turn (garbage, 300 MB bodies, drips, silence): /healthz stays 200, RSS stays
    bounded, and the probes report the lies as failures."""
    with daemon(tmp_path, "rotate") as (proc, url):
        seen = _watch(proc, url, WATCH_S)
    assert set(seen["healthz"]) == {200}, seen["ages"]
    assert max(seen["rss"]) < RSS_BOUND, f"max RSS {max(seen['rss']) / 2**20:.0f} MiB"
    assert {"health", "canary_tool", "progress"} <= seen["failed"], seen["failed"]


def test_a_slow_but_correct_server_reaches_serving_without_an_incident(tmp_path: Path) -> None:
    """Every answer a couple of seconds late (within the timeouts): serving, and no incident in the window."""
    with daemon(tmp_path, "slow_valid") as (proc, url):
        seen = _watch(proc, url, WATCH_S)
        status = seen["status"]
        if (
            status["servers"][0]["state"] == "starting"
        ):  # every canary takes seconds here: a loaded host needs longer

            def past_starting() -> dict[str, Any] | None:
                assert proc.poll() is None, "the daemon exited"
                body = _get(url + "/status")[1]
                return None if body["servers"][0]["state"] == "starting" else dict(body)

            status = wait_for(past_starting, 120, "the slow server past starting", interval=0.5)
    server = status["servers"][0]
    assert server["state"] == "serving" and not server["unproven"], server
    assert status["incidents"] == []
