"""SIGHUP reload: every section it can apply is applied; what needs a restart is refused, named, old config kept."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from supervisor.config import load_config
from supervisor.daemon import Daemon
from tests.support.wait import wait_until
from tests.unit.loop_fakes import FakeClock, FakeHost
from tests.unit.test_alert_sinks import INCIDENT, Receiver, refused_url

BASE = """
[supervisor]
state_dir = "state"
log_dir = "log"
gpu_backend = "none"
[supervisor.http]
port = 0
[[servers]]
name = "sim"
command = ["{python}", "-m", "simulator.launch_server"]
args = ["--model-path", "Qwen/Qwen3-8B", "--port", "31999"]
"""


def webhook(tmp_path: Path, url: str, name: str = "url") -> str:
    """An `[alerts.webhook]` table whose URL file holds `url` (no HMAC secret, retries with backoff)."""
    (tmp_path / name).write_text(url + "\n")
    (tmp_path / name).chmod(0o600)
    return f'[alerts]\nretries = 20\n[alerts.webhook]\nurl_file = "{name}"\n'


def write(tmp_path: Path, extra: str = "", base: str = BASE) -> Path:
    path = tmp_path / "sup.toml"
    path.write_text(base.format(python=sys.executable) + extra)
    return path


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    """A local HTTP receiver for the reloaded sinks."""
    r = Receiver()
    await r.start()
    try:
        yield r
    finally:
        await r.stop()


async def started(path: Path) -> Daemon:
    """A daemon over the fake host with its alert dispatcher running (the server loops are not started)."""
    d = Daemon(load_config(path, env={}), path, host=FakeHost(), clock=FakeClock())
    if d.alerts is not None:
        await d.alerts.start()
    return d


async def stopped(d: Daemon) -> None:
    if d.alerts is not None:
        await d.alerts.aclose(1.0)


def reload(d: Daemon) -> list[dict[str, Any]]:
    """SIGHUP's handler, with the log events it emitted."""
    with capture_logs() as logs:
        d.reload()
    return logs


def events(logs: list[dict[str, Any]]) -> list[str]:
    return [str(e["event"]) for e in logs]


async def test_an_alert_sink_added_by_reload_gets_the_next_alert(tmp_path: Path, receiver: Receiver) -> None:
    """Regression: a webhook added to [alerts] by SIGHUP logged config.reloaded and sent nothing until a restart."""
    d = await started(write(tmp_path))
    try:
        write(tmp_path, webhook(tmp_path, receiver.url("/new")))
        assert "config.reloaded" in events(reload(d))
        d.svc.incidents.page(INCIDENT, "operator needed")
        await wait_until(lambda: bool(receiver.requests), 10, "the alert at the new webhook")
        assert receiver.requests[0][0] == "/new"
    finally:
        await stopped(d)


async def test_alerts_queued_for_a_failing_sink_go_to_its_fixed_url(
    tmp_path: Path, receiver: Receiver
) -> None:
    """Fixing a sink's URL and reloading delivers what was queued for it (the runbook's advice), nothing lost."""
    d = await started(write(tmp_path, webhook(tmp_path, refused_url())))
    try:
        d.svc.incidents.page(INCIDENT, "operator needed")
        d.svc.incidents.page(INCIDENT, "still failed")
        write(tmp_path, webhook(tmp_path, receiver.url("/fixed")))
        assert "config.reloaded" in events(reload(d))
        await wait_until(lambda: len(receiver.requests) == 2, 10, "both queued alerts at the fixed URL")
        assert {r[0] for r in receiver.requests} == {"/fixed"}
    finally:
        await stopped(d)


@pytest.mark.parametrize(
    ("field", "edit"),
    [
        ("supervisor.http.port", ("port = 0", "port = 9411")),
        ("supervisor.http.host", ("port = 0", 'port = 0\nhost = "::1"')),
        ("supervisor.state_dir", ('state_dir = "state"', 'state_dir = "state2"')),
        ("servers[0].gpus", ('"--port", "31999"]', '"--port", "31999"]\ngpus = [3]')),
        ("servers[0].role", ('"--port", "31999"]', '"--port", "31999"]\nrole = "router"')),
    ],
)
async def test_a_change_that_needs_a_restart_is_refused_by_name(
    tmp_path: Path, field: str, edit: tuple[str, str]
) -> None:
    """Regression: [supervisor.http] changes logged config.reloaded and were ignored; now the reload is refused."""
    d = await started(write(tmp_path))
    try:
        before = d.config
        write(tmp_path, base=BASE.replace(*edit))
        logs = reload(d)
        assert "config.reloaded" not in events(logs)
        rejected = [e for e in logs if e["event"] == "config.reload_rejected"]
        assert rejected and field in str(rejected[0]), logs
        assert d.config is before
    finally:
        await stopped(d)


async def test_a_reload_applies_the_control_token_and_says_what_changed(tmp_path: Path) -> None:
    """A new token file is what /control checks from now on; config.reloaded names the changed sections."""
    (tmp_path / "token").write_text("t0k3n-for-the-reload-test\n")
    (tmp_path / "token").chmod(0o600)
    d = await started(write(tmp_path))
    try:
        write(tmp_path, base=BASE.replace("port = 0", 'port = 0\ntoken_file = "token"'))
        logs = reload(d)
        reloaded = [e for e in logs if e["event"] == "config.reloaded"]
        assert reloaded and "supervisor.http" in reloaded[0]["changed"], logs
        assert d.token_file() == tmp_path / "token"
    finally:
        await stopped(d)
