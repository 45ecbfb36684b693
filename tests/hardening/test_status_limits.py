"""The status endpoint's limits, against a stand-in daemon: slow clients, connection cap, pacing, cached documents."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from supervisor.config import HttpConfig
from supervisor.loop.commands import RungChange
from supervisor.reporting.admission import BURST, Pacer
from supervisor.reporting.readiness import Readiness
from supervisor.reporting.status_http import StatusServer
from tests.support.wait import wait_until

pytestmark = pytest.mark.hardening


class Source:
    """A daemon as the status server sees it, counting what it is asked to render."""

    def __init__(self, token_file: Path | None = None) -> None:
        self.renders = {"status": 0, "incidents": 0, "metrics": 0}
        self.token = token_file
        self.commands: list[str] = []

    def status_document(self) -> dict[str, Any]:
        self.renders["status"] += 1
        return {"state": "serving", "commands": list(self.commands)}

    def incidents_page(self, offset: int, limit: int) -> list[dict[str, Any]]:
        self.renders["incidents"] += 1
        return [{"id": f"i{n}"} for n in range(700)][offset : offset + limit][::-1]

    def metrics_text(self) -> bytes:
        self.renders["metrics"] += 1
        return b"sglang_supervisor_up 1\n"

    def loop_health(self) -> tuple[bool, float]:
        return True, 0.5

    def token_file(self) -> Path | None:
        return self.token

    async def control(self, kind: str, server: str | None, reason: str, actor: str) -> dict[str, str]:
        self.commands.append(kind)
        return {"sim": "done"}

    async def control_rung(self, server: str, change: RungChange, reason: str, actor: str) -> dict[str, Any]:
        raise KeyError(server)

    def readiness(self, server: str | None) -> list[Readiness]:
        return [Readiness("sim", True, "sim: serving")]


@asynccontextmanager
async def serving(source: Source, **limits: Any) -> AsyncIterator[StatusServer]:
    """A status server on a free loopback port."""
    server = StatusServer(source, HttpConfig(port=0, **limits))
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


async def request(
    port: int, path: str, method: str = "GET", headers: str = "", body: bytes = b""
) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 request on a new connection: status, headers (lower-case names), body."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        length = f"Content-Length: {len(body)}\r\n" if body else ""
        writer.write(f"{method} {path} HTTP/1.1\r\nHost: x\r\n{headers}{length}\r\n".encode() + body)
        return await response(reader)
    finally:
        writer.close()


async def response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    """Read one response."""
    head = (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)).decode("latin-1").split("\r\n")
    fields = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in head[1:] if h)}
    body = await asyncio.wait_for(reader.readexactly(int(fields.get("content-length", "0"))), 10)
    return int(head[0].split()[1]), fields, body


def test_a_slow_client_is_closed_after_the_idle_timeout() -> None:
    """Headers trickling in, or an idle keep-alive connection: closed once idle_timeout_s passes."""

    async def scenario() -> None:
        async with serving(Source(), idle_timeout_s=0.4) as server:
            slow_r, slow_w = await asyncio.open_connection("127.0.0.1", server.port)
            slow_w.write(b"GET /status HTTP/1.1\r\nHost: x\r\n")  # never finishes its headers
            idle_r, idle_w = await asyncio.open_connection("127.0.0.1", server.port)
            idle_w.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            assert (await response(idle_r))[0] == 200
            assert await asyncio.wait_for(slow_r.read(), 10) == b"", "the slow client was closed"
            assert await asyncio.wait_for(idle_r.read(), 10) == b"", "the idle client was closed"
            await wait_until(lambda: not server.gate.open, 10, "every slot free again")
            slow_w.close()
            idle_w.close()

    asyncio.run(scenario())


def test_clients_over_the_connection_limit_wait_and_are_served_in_turn() -> None:
    """max_connections held: a further client waits in the accept queue; at capacity answers close."""

    async def scenario() -> None:
        async with serving(Source(), max_connections=2) as server:
            held = [await asyncio.open_connection("127.0.0.1", server.port) for _ in range(2)]
            await wait_until(lambda: len(server.gate.open) == 2, 10, "two connections accepted")
            third = asyncio.create_task(request(server.port, "/healthz"))
            await wait_until(lambda: server.gate.full, 10, "the gate full")
            assert len(server.gate.open) == 2 and not third.done()
            held[0][1].close()
            status, fields, _ = await asyncio.wait_for(third, 10)
            assert status == 200 and fields["connection"].lower() == "close", fields
            held[1][1].close()

    asyncio.run(scenario())


def test_requests_over_the_rate_wait_for_their_turn() -> None:
    """After the burst, request starts are spaced 1/max_requests_per_s apart (a fake clock)."""
    now = [100.0]
    pacer = Pacer(rate=10, clock=lambda: now[0])
    assert [pacer.delay() for _ in range(BURST)] == [0.0] * BURST
    waits = [pacer.delay() for _ in range(3)]
    assert waits == pytest.approx([0.1, 0.2, 0.3])
    now[0] += 60
    assert pacer.delay() == 0.0, "an idle minute restores the burst"


def test_documents_are_rendered_once_per_period_and_after_a_command(tmp_path: Path) -> None:
    """Many reads within cache_s: one render each; a control command or a state change makes the next read fresh."""

    async def scenario(token: Path) -> None:
        source = Source(token)
        async with serving(source, cache_s=60) as server:
            for path in ("/status", "/metrics", "/incidents?limit=500", "/incidents?offset=650&limit=100"):
                for _ in range(5):
                    assert (await request(server.port, path))[0] == 200
            assert source.renders == {"status": 1, "incidents": 1, "metrics": 1}
            page = json.loads((await request(server.port, "/incidents?offset=2&limit=3"))[2])
            assert page == {
                "offset": 2,
                "limit": 3,
                "incidents": [{"id": "i697"}, {"id": "i696"}, {"id": "i695"}],
            }
            auth = "Authorization: Bearer tok\r\n"
            status, _, _ = await request(server.port, "/control/pause", "POST", auth, b'{"server": "sim"}')
            assert status == 200
            body = json.loads((await request(server.port, "/status"))[2])
            assert body["commands"] == ["pause"] and source.renders["status"] == 2
            server.changed()  # what the daemon calls on every state transition
            assert (await request(server.port, "/status"))[0] == 200 and source.renders["status"] == 3

    (tmp_path / "token").write_text("tok\n")
    asyncio.run(scenario(tmp_path / "token"))


def test_the_journal_renders_off_the_loop() -> None:
    """While the journal is being read (held here), the loop still answers /healthz; then /incidents answers."""
    release = threading.Event()

    class SlowJournal(Source):
        def incidents_page(self, offset: int, limit: int) -> list[dict[str, Any]]:
            release.wait(30)
            return super().incidents_page(offset, limit)

    async def scenario() -> None:
        source = SlowJournal()
        async with serving(source) as server:
            page = asyncio.create_task(request(server.port, "/incidents?limit=2"))
            await wait_until(lambda: server.journal.rendering is not None, 10, "the journal being read")
            assert (await request(server.port, "/healthz"))[0] == 200
            assert not page.done()
            release.set()
            status, _, body = await asyncio.wait_for(page, 10)
            assert status == 200 and json.loads(body)["incidents"] == [{"id": "i699"}, {"id": "i698"}]

    try:
        asyncio.run(scenario())
    finally:
        release.set()


def test_oversized_or_slow_requests_are_refused(tmp_path: Path) -> None:
    """A header line over 8190 bytes: 400; a control body over 16 KiB: 413; a body that never comes: 408."""

    async def scenario(token: Path) -> None:
        async with serving(Source(token), idle_timeout_s=0.4) as server:
            long_header = f"X-Long: {'a' * 9000}\r\n"
            assert (await request(server.port, "/status", headers=long_header))[0] == 400
            auth = "Authorization: Bearer tok\r\n"
            big = json.dumps({"reason": "x" * 20000}).encode()
            assert (await request(server.port, "/control/pause", "POST", auth, big))[0] == 413
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            writer.write(
                f"POST /control/pause HTTP/1.1\r\nHost: x\r\n{auth}Content-Length: 50\r\n\r\n".encode()
            )
            assert (await response(reader))[0] == 408
            writer.close()

    (tmp_path / "token").write_text("tok\n")
    asyncio.run(scenario(tmp_path / "token"))
