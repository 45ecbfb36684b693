"""One blocking HTTP request to a loopback server, as an operator's `curl` would see it."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any

MAX_BODY = 1 << 24


@dataclass
class Response:
    """An HTTP answer: status (0 when the connection was refused), headers and body."""

    status: int
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)

    def json(self) -> Any:
        """The body decoded as JSON."""
        return json.loads(self.body)


def http(
    url: str,
    method: str = "GET",
    body: bytes | dict[str, Any] | None = None,
    timeout: float = 10.0,
    content_type: str = "application/json",
    headers: dict[str, str] | None = None,
) -> Response:
    """One HTTP request; a refused connection is status 0, an HTTP error keeps its status and body."""
    data = json.dumps(body).encode() if isinstance(body, dict) else body
    req = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    if data is not None:
        req.add_header("Content-Type", content_type)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return Response(resp.status, resp.read(MAX_BODY), dict(resp.headers))
    except urllib.error.HTTPError as exc:
        return Response(exc.code, exc.read(MAX_BODY), dict(exc.headers))
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, ConnectionRefusedError):
            return Response(0, b"")
        if isinstance(exc.reason, TimeoutError):
            raise exc.reason from exc
        raise
