"""The `/workers` API of SGLang's gateways, SMG 1.13.0 and sglang-router 0.3.2 (reference: gateway.md).

Both: `GET /workers` lists `{"workers": [{"id", "url", "model_id", "is_healthy", …}]}` (SMG adds `status`), `POST
/workers {"url", "worker_type", "bootstrap_port"}` answers 202 with the new `worker_id` (the gateway assigns ids, a
new one on every re-add), `DELETE /workers/{id}` answers 202. They differ: a URL added twice is 409 on SMG and
202 with the old id on the router; SMG keeps a removed worker 5 s as `draining`. Every call has the configured
timeout and reads at most `MAX_BODY` bytes; a failure is a `GatewayError` naming what went wrong, never a hang.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import aiohttp

from policies.membership import Listed
from probes.base import read_capped

MAX_BODY = 4 * 1024 * 1024


class GatewayError(Exception):
    """A call that did not do what was asked: `kind` is unreachable | auth | status | body."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(detail)
        self.kind = kind


@dataclass
class GatewayClient:
    """One gateway's `/workers` API, with the admin key (never logged) and a timeout on every call."""

    url: str
    key: str | None
    timeout_s: float
    session: aiohttp.ClientSession | None = None

    def _http(self) -> aiohttp.ClientSession:
        if self.session is None or self.session.closed:
            self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout_s))
        return self.session

    async def aclose(self) -> None:
        """Close the HTTP session."""
        if self.session is not None:
            await self.session.close()

    async def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
        headers = {"Authorization": f"Bearer {self.key}"} if self.key else {}
        try:
            async with self._http().request(
                method, self.url.rstrip("/") + path, json=body, headers=headers
            ) as resp:
                raw = await read_capped(resp, MAX_BODY + 1)
                status = resp.status
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise GatewayError("unreachable", f"{method} {path}: {type(exc).__name__} {exc}"[:300]) from None
        if status in (401, 403):
            raise GatewayError("auth", f"{method} {path}: HTTP {status} (check [gateway] admin_key_file)")
        if len(raw) > MAX_BODY:
            raise GatewayError("body", f"{method} {path}: answer over {MAX_BODY} bytes")
        try:
            return status, json.loads(raw) if raw.strip() else None
        except ValueError:
            return status, raw[:200].decode("utf-8", "replace")

    async def workers(self) -> list[Listed]:
        """Every worker the gateway lists (its ids, URLs, status)."""
        status, body = await self._call("GET", "/workers")
        if status != 200 or not isinstance(body, dict) or not isinstance(body.get("workers"), list):
            raise GatewayError("status", f"GET /workers: HTTP {status}: not a gateway's worker list")
        out = []
        for w in body["workers"]:
            if isinstance(w, dict) and isinstance(w.get("id"), str) and isinstance(w.get("url"), str):
                out.append(
                    Listed(
                        w["id"],
                        w["url"],
                        str(w.get("status") or ""),
                        bool(w.get("is_healthy", True)),
                        str(w.get("model_id") or ""),
                    )
                )
        return out

    async def add(self, url: str, worker_type: str = "regular", bootstrap_port: int | None = None) -> str:
        """Add `url` as a worker; its id ('' when the gateway answered 409: it has it already)."""
        body: dict[str, Any] = {"url": url}
        if worker_type != "regular":
            body["worker_type"] = worker_type
        if bootstrap_port is not None:
            body["bootstrap_port"] = bootstrap_port
        status, answer = await self._call("POST", "/workers", body)
        if status == 409:
            return ""
        if status not in (200, 201, 202):
            raise GatewayError("status", f"POST /workers {url}: HTTP {status}: {str(answer)[:200]}")
        return str(answer.get("worker_id") or "") if isinstance(answer, dict) else ""

    async def remove(self, worker_id: str) -> None:
        """Remove the worker `worker_id` (already gone is done too)."""
        status, answer = await self._call("DELETE", f"/workers/{worker_id}")
        if status not in (200, 202, 204, 404):
            raise GatewayError("status", f"DELETE /workers/{worker_id}: HTTP {status}: {str(answer)[:200]}")
