"""The Alertmanager sink against the real Alertmanager binary: fire shows active, resolve clears it."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from supervisor import packaged
from supervisor.alerts.dispatcher import AlertDispatcher, AlertmanagerSink
from supervisor.records.incident import Incident
from supervisor.reporting.metrics import SupervisorMetrics
from tests.support.ports import free_port
from tests.support.tools import ensure_alertmanager, ensure_amtool
from tests.support.wait import wait_until

CONFIG = """\
route:
  receiver: test-webhook
  group_by: [alertname, server, incident]
  group_wait: 0s
  group_interval: 1s
  repeat_interval: 1h
receivers:
  - name: test-webhook
    webhook_configs:
      - url: http://127.0.0.1:{port}/am-webhook
        send_resolved: true
"""


@pytest.fixture
async def webhook() -> AsyncIterator[tuple[int, list[dict[str, Any]]]]:
    """A local receiver for Alertmanager's webhook notifications: (port, received bodies)."""
    received: list[dict[str, Any]] = []

    async def handle(request: web.Request) -> web.Response:
        received.append(json.loads(await request.content.read(1 << 20)))
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/am-webhook", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield runner.addresses[0][1], received
    finally:
        await runner.cleanup()


@pytest.fixture
def alertmanager(tmp_path: Path, webhook: tuple[int, list[dict[str, Any]]]) -> Iterator[str]:
    """A real Alertmanager on 127.0.0.1 (clustering off, temp storage); yields its base URL."""
    config = tmp_path / "alertmanager.yml"
    config.write_text(CONFIG.format(port=webhook[0]))
    check = subprocess.run(
        [str(ensure_amtool()), "check-config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert check.returncode == 0, check.stdout + check.stderr
    port = free_port()
    binary = ensure_alertmanager()
    with (tmp_path / "alertmanager.log").open("wb") as log:
        proc = subprocess.Popen(
            [
                str(binary),
                f"--config.file={config}",
                f"--storage.path={tmp_path / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--cluster.listen-address=",
                "--log.level=warn",
            ],
            cwd=binary.parents[2],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


async def active_alerts(session: aiohttp.ClientSession, base: str) -> list[dict[str, Any]]:
    """Alertmanager's `GET /api/v2/alerts` (active alerts only), or [] while it is not up."""
    try:
        async with session.get(f"{base}/api/v2/alerts") as resp:
            if resp.status != 200:
                return []
            alerts: list[dict[str, Any]] = json.loads(await resp.content.read(1 << 20))
            return alerts
    except aiohttp.ClientError:
        return []


async def test_fire_then_resolve_through_real_alertmanager(
    alertmanager: str, webhook: tuple[int, list[dict[str, Any]]]
) -> None:
    """A fired incident is active in Alertmanager and notified; its resolve removes it and notifies resolved."""
    incident = Incident(
        id=f"inc-{int(time.time())}-am",
        server="decode",
        fault="collective_hang",
        detected_at=time.time(),
        action="restart",
    )
    received = webhook[1]
    metrics = SupervisorMetrics()
    dispatcher = AlertDispatcher(
        [AlertmanagerSink(alertmanager, source="test-host")], metrics=metrics, rate_limit_per_min=600
    )
    async with aiohttp.ClientSession() as session:

        async def ready() -> bool:
            try:
                async with session.get(f"{alertmanager}/-/ready") as resp:
                    return resp.status == 200
            except aiohttp.ClientError:
                return False

        await wait_until(ready, 20, "Alertmanager to be ready")
        await dispatcher.start()
        try:
            dispatcher.fire(incident)

            async def is_active() -> bool:
                alerts = await active_alerts(session, alertmanager)
                return any(
                    a["labels"].get("incident") == incident.id and a["status"]["state"] == "active"
                    for a in alerts
                )

            await wait_until(is_active, 20, "the alert to be active")
            (alert,) = [
                a
                for a in await active_alerts(session, alertmanager)
                if a["labels"].get("incident") == incident.id
            ]
            assert alert["labels"]["alertname"] == "SglangSupervisorIncident"
            assert alert["labels"]["severity"] == "critical"
            assert alert["annotations"]["runbook_url"] == f"{packaged.runbook_url()}#collective_hang"

            async def notified(status: str) -> bool:
                return any(
                    b["status"] == status and b["alerts"][0]["labels"]["incident"] == incident.id
                    for b in received
                )

            await wait_until(lambda: notified("firing"), 20, "the firing notification")

            dispatcher.resolve(incident.resolve(recovered_at=time.time(), time_to_serving_s=5.0))

            async def is_gone() -> bool:
                alerts = await active_alerts(session, alertmanager)
                return not any(a["labels"].get("incident") == incident.id for a in alerts)

            await wait_until(is_gone, 20, "the alert to leave the active list")
            await wait_until(lambda: notified("resolved"), 20, "the resolved notification")
        finally:
            await dispatcher.aclose()
    assert (
        metrics.registry.get_sample_value(
            "sglang_supervisor_alert_deliveries_total", {"sink": "alertmanager", "outcome": "ok"}
        )
        == 2.0
    )
