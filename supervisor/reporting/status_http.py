"""The status endpoint: `/healthz`, `/status`, `/incidents`, `/metrics`, `/ready`, `/servers/<name>/ready`, and
token-guarded `/control/*`.

Bound to loopback by default. Control endpoints answer 403 (with how to enable them) when no token is
configured, 401 without or with a wrong bearer token (constant-time compare). Nothing secret is served:
every body goes through `supervisor.redaction.hide`.

The server shares the daemon's one event loop with supervision, so its clients' cost is bounded: `/status`,
`/metrics` and the incident journal are rendered at most every `cache_s` (and after each state change) and
served as cached bytes (`status_cache`), and connections, request rate, request sizes and slow clients are limited
(`admission`).
`/healthz` and the readiness answers are computed on every request from the state the owners hold, which is
O(servers): no probe is sent per request.
"""

from __future__ import annotations

import hmac
import json
import sys
from pathlib import Path
from typing import Any, Protocol

import structlog
from aiohttp import web

from supervisor.config import HttpConfig
from supervisor.loop.commands import RungChange
from supervisor.redaction import hide
from supervisor.reporting.admission import Gate, listeners, read_within
from supervisor.reporting.metrics import CONTENT_TYPE
from supervisor.reporting.readiness import Readiness, overall
from supervisor.reporting.status_cache import Cached, Threaded
from supervisor.rungs import RungRefused, parse_request

log = structlog.get_logger()
MAX_CONTROL_BODY = 16 * 1024
MAX_HEADER_LINE = 8190  # bytes of the request line and of each header field
MAX_PAGE = 500


def load_token(path: Path) -> str:
    """The control token in `path` (stripped); OSError when unreadable, ValueError when empty."""
    try:
        token = Path(path).read_text()[:4096].strip()
    except UnicodeDecodeError:
        raise ValueError("a file holding the bearer token as UTF-8 text") from None
    if not token:
        raise ValueError("a file holding the bearer token (it is empty)")
    return token


def read_token(path: Path | None) -> str | None:
    """The control token from its file, or None when not configured, unreadable or empty."""
    if path is None:
        return None
    try:
        return load_token(path)
    except OSError as exc:
        log.error("control.token_unreadable", path=str(path), error=exc.strerror)
    except ValueError as exc:
        log.error("control.token_unreadable", path=str(path), error=str(exc))
    return None


class StatusSource(Protocol):
    """What the status server reads and asks of the daemon — nothing more."""

    def status_document(self) -> dict[str, Any]:
        """The `/status` JSON document."""
        ...

    def incidents_page(self, offset: int, limit: int) -> list[dict[str, Any]]:
        """A page of the incident journal, newest first; called from a worker thread (it reads the file only)."""
        ...

    def metrics_text(self) -> bytes:
        """The Prometheus exposition."""
        ...

    def loop_health(self) -> tuple[bool, float]:
        """(every server loop fresh, seconds since the stalest one beat)."""
        ...

    def token_file(self) -> Path | None:
        """The control token's file, as configured now."""
        ...

    async def control(self, kind: str, server: str | None, reason: str, actor: str) -> dict[str, str]:
        """Queue an operator command; KeyError for an unknown server."""
        ...

    async def control_rung(self, server: str, change: RungChange, reason: str, actor: str) -> dict[str, Any]:
        """An operator's ladder level; KeyError for an unknown server, RungRefused when it cannot apply."""
        ...

    def readiness(self, server: str | None) -> list[Readiness]:
        """Each server's readiness, or the named one's (KeyError when unknown)."""
        ...


class StatusServer:
    """aiohttp app serving the daemon's status."""

    def __init__(self, source: StatusSource, http: HttpConfig) -> None:
        self.source = source
        self.runner: web.AppRunner | None = None
        self.host, self.port = http.host, http.port
        self.url = f"http://{self.host}:{self.port}"
        self.idle_timeout_s = http.idle_timeout_s
        self.gate = Gate(http.max_connections, http.max_requests_per_s, http.idle_timeout_s)
        self.status_body = Cached(self._render_status, http.cache_s)
        self.metrics_body = Cached(self.source.metrics_text, http.cache_s)
        self.journal = Threaded(self._render_journal, http.cache_s)

    def app(self) -> web.Application:
        """Routes."""
        app = web.Application(client_max_size=MAX_CONTROL_BODY, middlewares=[self.gate.middleware])
        app.router.add_get("/healthz", self.healthz)
        app.router.add_get("/status", self.status)
        app.router.add_get("/incidents", self.incidents)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_get("/ready", self.ready)
        app.router.add_get("/servers/{name}/ready", self.server_ready)
        app.router.add_post("/control/{action:restart|pause|resume}", self.control)
        app.router.add_post("/control/rung", self.control_rung)
        return app

    async def start(self) -> None:
        """Bind and serve (the bound port is known even when 0 was asked)."""
        socks = listeners(self.host, self.port)
        self.runner = web.AppRunner(
            self.app(),
            access_log=None,
            handle_signals=False,
            max_line_size=MAX_HEADER_LINE,
            max_field_size=MAX_HEADER_LINE,
        )
        await self.runner.setup()
        assert self.runner.server is not None
        self.gate.start(socks, self.runner.server)
        self.port = int(socks[0].getsockname()[1])
        self.url = f"http://{self.host}:{self.port}"

    async def stop(self) -> None:
        """Stop serving."""
        await self.gate.stop()
        if self.runner is not None:
            await self.runner.cleanup()

    def _render_status(self) -> bytes:
        body = json.loads(json.dumps(self.source.status_document(), default=str))
        return json.dumps(hide(body)).encode()

    def _render_journal(self) -> list[bytes]:
        """Every incident of the journal, newest first, each as its JSON bytes (in a worker thread)."""
        return [json.dumps(hide(i), default=str).encode() for i in self.source.incidents_page(0, sys.maxsize)]

    async def healthz(self, request: web.Request) -> web.Response:
        """200 while every server loop beats (or is inside a bounded step); 503 when one is stale."""
        ok, age = self.source.loop_health()
        return web.json_response({"ok": ok, "loop_age_s": round(age, 3)}, status=200 if ok else 503)

    async def status(self, request: web.Request) -> web.Response:
        """Daemon and server state, recent incidents."""
        return web.Response(body=self.status_body.get(), content_type="application/json", charset="utf-8")

    async def incidents(self, request: web.Request) -> web.Response:
        """The incident journal, newest first, paged with `offset` and `limit` (≤ 500)."""
        try:
            offset = max(0, int(request.query.get("offset", "0")))
            limit = min(MAX_PAGE, max(1, int(request.query.get("limit", "50"))))
        except ValueError:
            return web.json_response({"error": "offset and limit must be integers"}, status=400)
        page = b", ".join((await self.journal.fetch())[offset : offset + limit])
        body = b'{"offset": %d, "limit": %d, "incidents": [%s]}' % (offset, limit, page)
        return web.Response(body=body, content_type="application/json", charset="utf-8")

    async def metrics(self, request: web.Request) -> web.Response:
        """Prometheus text exposition."""
        return web.Response(body=self.metrics_body.get(), headers={"Content-Type": CONTENT_TYPE})

    async def ready(self, request: web.Request) -> web.Response:
        """200 when every server is serving and proven, else 503 with a line per server that is not."""
        ok, text = overall(self.source.readiness(None))
        return web.Response(text=str(hide(text)) + "\n", status=200 if ok else 503)

    async def server_ready(self, request: web.Request) -> web.Response:
        """200 when this server is serving and proven, else 503; one line that says why; 404 if unknown."""
        name = request.match_info["name"]
        try:
            (found,) = self.source.readiness(name)
        except KeyError:
            return web.Response(text=f"unknown server {name!r}\n", status=404)
        return web.Response(text=str(hide(found.line)) + "\n", status=200 if found.ready else 503)

    async def _authorized_body(self, request: web.Request) -> dict[str, Any] | web.Response:
        """The JSON object of a control request whose bearer token matches; else the answer that refuses it."""
        token = read_token(self.source.token_file())
        if token is None:
            return web.json_response(
                {
                    "error": "control endpoints are disabled: set supervisor.http.token_file to a file holding a bearer token"
                },
                status=403,
            )
        given = request.headers.get("Authorization", "")
        scheme, _, value = given.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(value.strip().encode(), token.encode()):
            return web.json_response(
                {"error": "missing or wrong bearer token"}, status=401, headers={"WWW-Authenticate": "Bearer"}
            )
        try:
            raw = await read_within(request, self.idle_timeout_s) if request.can_read_body else b""
        except TimeoutError:
            return web.json_response({"error": "request body too slow"}, status=408)
        try:
            body = json.loads(raw) if raw else {}
        except ValueError:
            return web.json_response({"error": "body must be JSON"}, status=400)
        if not isinstance(body, dict):
            return web.json_response({"error": "body must be a JSON object"}, status=400)
        return body

    def _who(self, request: web.Request, body: dict[str, Any]) -> tuple[str, str]:
        reason = str(body.get("reason") or "")[:500]
        actor = str(body.get("actor") or request.headers.get("X-Actor") or "operator")[:100]
        return reason, actor

    def changed(self) -> None:
        """The state changed (a transition, an operator command): the next request of each document renders it
        again, so a transition and the PID, incident and restarts that come with it show at once."""
        for cached in (self.status_body, self.metrics_body, self.journal):
            cached.invalidate()

    async def control(self, request: web.Request) -> web.Response:
        """restart / pause / resume, for one server (`server`) or all; `reason` and `actor` go to the journal."""
        body = await self._authorized_body(request)
        if isinstance(body, web.Response):
            return body
        action = request.match_info["action"]
        server = body.get("server")
        reason, actor = self._who(request, body)
        try:
            result = await self.source.control(action, str(server) if server else None, reason, actor)
        except KeyError:
            return web.json_response({"error": f"unknown server {server!r}"}, status=404)
        self.changed()
        return web.json_response({"action": action, "servers": result})

    async def control_rung(self, request: web.Request) -> web.Response:
        """`{server, action: set|reset, ladder, level, restart, reason, actor}`: a ladder level for the next
        launch (or now, with `restart`); 404 for an unknown server, 400 with why for anything else wrong."""
        body = await self._authorized_body(request)
        if isinstance(body, web.Response):
            return body
        reason, actor = self._who(request, body)
        try:
            server, change = parse_request(body)
            result = await self.source.control_rung(server, change, reason, actor)
        except KeyError:
            return web.json_response({"error": f"unknown server {body.get('server')!r}"}, status=404)
        except RungRefused as exc:
            return web.json_response({"error": str(exc)}, status=400)
        self.changed()
        return web.json_response({"action": f"rung {body['action']}", **result})
