"""Admission to the status endpoint: what its clients can make the daemon's one event loop do is bounded.

- **Connections**: at most `max_connections` are open. The listening sockets are accepted from only while a slot
  is free; further clients wait in the kernel's accept queue, which costs the loop nothing.
- **Turns**: at capacity every response closes its connection, so the clients in the accept queue are served in
  turn (first come, first served) instead of the first `max_connections` keeping their slots for ever.
- **Rate**: at most `max_requests_per_s` requests start per second (a short burst allowed); a request over the
  rate waits for its turn on its own connection, which sends nothing more meanwhile (HTTP/1.1).
- **Slow clients**: a connection that has not sent a complete request within `idle_timeout_s` of connecting or
  of its last response is closed (slow headers, idle keep-alive); handlers bound a body read by the same time.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Awaitable, Callable

import structlog
from aiohttp import web

log = structlog.get_logger()
BACKLOG = 1024  # the kernel's accept queue: clients over the connection limit wait there
BURST = 20  # requests that may start at once before the rate applies
ACCEPT_RETRY_S = 0.5  # after a failed accept (e.g. out of file descriptors)


class Pacer:
    """Spaces request starts `1 / rate` apart after a burst of `burst` (a generic cell rate algorithm)."""

    def __init__(self, rate: float, burst: int = BURST, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval = 1.0 / rate
        self.window = burst * self.interval
        self.clock = clock
        self.due = 0.0  # when the next request's turn is, with the burst not counted

    def delay(self) -> float:
        """Take the next turn: seconds to wait before starting (0 within the burst)."""
        now = self.clock()
        self.due = max(self.due, now) + self.interval
        return max(0.0, self.due - self.window - now)


class _Tracked(asyncio.Protocol):
    """An HTTP connection's protocol, wrapped so the gate knows when it opens, closes and goes idle."""

    def __init__(self, inner: asyncio.Protocol, gate: Gate) -> None:
        self.inner, self.gate = inner, gate
        self.transport: asyncio.BaseTransport | None = None
        self.busy = 0
        self.idle_since = gate.clock()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.gate.opened(self)
        self.inner.connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self.gate.closed(self)
        self.inner.connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()


def listeners(host: str, port: int) -> list[socket.socket]:
    """Non-blocking listening sockets for `host` (every address it resolves to) on `port` (0: one free port)."""
    infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    socks: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in dict.fromkeys(infos):
            sock = socket.socket(family, kind, proto)
            socks.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            if port == 0 and len(socks) > 1:
                address = (address[0], socks[0].getsockname()[1], *address[2:])
            sock.bind(address)
            sock.listen(BACKLOG)
            sock.setblocking(False)
    except OSError:
        for sock in socks:
            sock.close()
        raise
    return socks


class Gate:
    """Accepts connections for an aiohttp server within the limits above; `middleware` paces the requests."""

    def __init__(
        self,
        max_connections: int,
        max_requests_per_s: float,
        idle_timeout_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.factory: Callable[[], asyncio.Protocol] | None = None
        self.clock = clock
        self.idle_timeout_s = idle_timeout_s
        self.pacer = Pacer(max_requests_per_s, clock=clock)
        self.slots = asyncio.Semaphore(max_connections)
        self.open: dict[asyncio.BaseTransport, _Tracked] = {}
        self.tasks: list[asyncio.Task[None]] = []
        self.socks: list[socket.socket] = []

    @property
    def full(self) -> bool:
        """Every connection slot is taken."""
        return self.slots.locked()

    def start(self, socks: list[socket.socket], factory: Callable[[], asyncio.Protocol]) -> None:
        """Accept on `socks` (one task each) into protocols from `factory`, and sweep idle connections."""
        self.socks, self.factory = socks, factory
        self.tasks = [asyncio.create_task(self._accept(sock), name="status.accept") for sock in socks]
        self.tasks.append(asyncio.create_task(self._sweep(), name="status.sweep"))

    async def stop(self) -> None:
        """Stop accepting, close the listening sockets and every open connection."""
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        for sock in self.socks:
            sock.close()
        for tracked in list(self.open.values()):
            if tracked.transport is not None:
                tracked.transport.close()

    async def _accept(self, sock: socket.socket) -> None:
        aio = asyncio.get_running_loop()
        factory = self.factory
        assert factory is not None
        while True:
            await self.slots.acquire()
            try:
                conn, _ = await aio.sock_accept(sock)
            except OSError as exc:
                self.slots.release()
                log.warning("status.accept_failed", error=exc.strerror or repr(exc))
                await asyncio.sleep(ACCEPT_RETRY_S)
                continue
            except BaseException:
                self.slots.release()
                raise
            try:
                await aio.connect_accepted_socket(lambda: _Tracked(factory(), self), conn)
            except OSError:
                conn.close()
                self.slots.release()

    def opened(self, tracked: _Tracked) -> None:
        """A connection was made (its slot was taken at accept)."""
        assert tracked.transport is not None
        self.open[tracked.transport] = tracked

    def closed(self, tracked: _Tracked) -> None:
        """A connection was lost: its slot is free again."""
        if tracked.transport is not None and self.open.pop(tracked.transport, None) is not None:
            self.slots.release()

    async def _sweep(self) -> None:
        """Close connections idle (no complete request under way) for longer than the idle timeout."""
        while True:
            await asyncio.sleep(self.idle_timeout_s / 4)
            limit = self.clock() - self.idle_timeout_s
            for tracked in list(self.open.values()):
                if tracked.busy == 0 and tracked.idle_since < limit and tracked.transport is not None:
                    tracked.transport.close()

    @web.middleware
    async def middleware(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        """Mark the connection busy, wait for the request's turn, answer; at capacity, close after answering."""
        tracked = self.open.get(request.transport) if request.transport is not None else None
        if tracked is not None:
            tracked.busy += 1
        try:
            wait = self.pacer.delay()
            if wait > 0:
                await asyncio.sleep(wait)
            try:
                response = await handler(request)
            except web.HTTPException as exc:
                if self.full:
                    exc.force_close()
                raise
            if self.full:
                response.force_close()
            return response
        finally:
            if tracked is not None:
                tracked.busy -= 1
                tracked.idle_since = self.clock()


async def read_within(request: web.Request, timeout_s: float) -> bytes:
    """The request body, read within `timeout_s` (TimeoutError otherwise)."""
    async with asyncio.timeout(timeout_s):
        return await request.read()
