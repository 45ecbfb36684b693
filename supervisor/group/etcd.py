"""A small etcd v3 client over etcd's JSON gateway (`/v3/...`), on the aiohttp the daemon already uses.

Why the gateway and not a Python etcd client: docs/group-protocol.md ("Client"). Every call has a timeout
and a bounded response; a failure of any kind (connection, timeout, HTTP error, malformed body) raises
`EtcdUnavailable` after every endpoint was tried, so callers handle one exception. Keys and values are
text; the base64 of the gateway stays inside this module. Secrets (password, client key) are read from
files by the caller and never appear in a log line or an exception.
"""

from __future__ import annotations

import base64
import json
import ssl
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

MAX_RESPONSE_BYTES = 4 << 20


class EtcdUnavailable(Exception):
    """No endpoint answered the request (the message names the call, never a secret)."""


@dataclass(frozen=True, slots=True)
class KeyValue:
    """One key as etcd stores it: the text value and the revisions a transaction can compare on."""

    key: str
    value: str
    mod_revision: int
    create_revision: int
    lease: int = 0


@dataclass(frozen=True, slots=True)
class Event:
    """One change seen by a watch: `put` (with the new value) or `delete`."""

    kind: str
    kv: KeyValue


@dataclass(frozen=True, slots=True)
class Compare:
    """A transaction guard on one key: its `mod_revision` equals `mod_revision` (0 = key absent)."""

    key: str
    mod_revision: int

    def body(self) -> dict[str, Any]:
        """The gateway's JSON for this guard."""
        if self.mod_revision == 0:
            return {"key": _b64(self.key), "target": "CREATE", "result": "EQUAL", "create_revision": "0"}
        return {
            "key": _b64(self.key),
            "target": "MOD",
            "result": "EQUAL",
            "mod_revision": str(self.mod_revision),
        }


@dataclass(frozen=True, slots=True)
class Put:
    """A put inside a transaction."""

    key: str
    value: str
    lease: int = 0

    def body(self) -> dict[str, Any]:
        """The gateway's JSON for this operation."""
        return {"request_put": {"key": _b64(self.key), "value": _b64(self.value), "lease": str(self.lease)}}


@dataclass(frozen=True, slots=True)
class DeletePrefix:
    """A delete of every key under `prefix`, inside a transaction."""

    prefix: str

    def body(self) -> dict[str, Any]:
        """The gateway's JSON for this operation."""
        return {
            "request_delete_range": {"key": _b64(self.prefix), "range_end": _b64(prefix_end(self.prefix))}
        }


@dataclass(frozen=True, slots=True)
class EtcdSettings:
    """Where etcd is and how to talk to it (`[group]` in the config builds this)."""

    endpoints: tuple[str, ...]
    timeout_s: float = 5.0
    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None
    username: str = ""
    password: str = field(default="", repr=False)


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _unb64(text: str) -> str:
    return base64.b64decode(text).decode(errors="replace")


def prefix_end(prefix: str) -> str:
    """The range end that makes `[prefix, end)` every key starting with `prefix` (ASCII prefixes)."""
    return prefix[:-1] + chr(ord(prefix[-1]) + 1)


def _kv(raw: dict[str, Any]) -> KeyValue:
    return KeyValue(
        key=_unb64(raw.get("key", "")),
        value=_unb64(raw.get("value", "")),
        mod_revision=int(raw.get("mod_revision", 0)),
        create_revision=int(raw.get("create_revision", 0)),
        lease=int(raw.get("lease", 0)),
    )


def ssl_context(settings: EtcdSettings) -> ssl.SSLContext | None:
    """A client TLS context from the CA and client certificate files, or None for plain HTTP."""
    if settings.ca_file is None and settings.cert_file is None:
        return None
    context = ssl.create_default_context(cafile=str(settings.ca_file) if settings.ca_file else None)
    if settings.cert_file is not None:
        context.load_cert_chain(
            str(settings.cert_file), str(settings.key_file) if settings.key_file else None
        )
    return context


class EtcdClient:
    """Range, put, txn, leases and watches against the first endpoint that answers."""

    def __init__(self, settings: EtcdSettings) -> None:
        self.settings = settings
        self._ssl = ssl_context(settings)
        self._session: aiohttp.ClientSession | None = None
        self._token = ""
        self._preferred = 0

    async def __aenter__(self) -> EtcdClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the HTTP session (idempotent)."""
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=self._ssl or False))
        return self._session

    def _endpoints(self) -> list[str]:
        eps = list(self.settings.endpoints)
        return eps[self._preferred :] + eps[: self._preferred]

    async def _authenticate(self, endpoint: str) -> None:
        body = {"name": self.settings.username, "password": self.settings.password}
        reply = await self._post_once(endpoint, "/v3/auth/authenticate", body, auth=False)
        self._token = str(reply.get("token", ""))

    async def _post_once(self, endpoint: str, path: str, body: dict[str, Any], auth: bool = True) -> Any:
        headers = {"Authorization": self._token} if auth and self._token else {}
        timeout = aiohttp.ClientTimeout(total=self.settings.timeout_s)
        async with self._http().post(endpoint + path, json=body, headers=headers, timeout=timeout) as resp:
            raw = await resp.content.read(MAX_RESPONSE_BYTES)
            if resp.status != 200:
                raise _HttpStatus(resp.status, raw[:200].decode(errors="replace"))
            return json.loads(raw)

    async def call(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST `body` to `path` on the first endpoint that answers; raises EtcdUnavailable."""
        problems: list[str] = []
        for endpoint in self._endpoints():
            try:
                if self.settings.username and not self._token:
                    await self._authenticate(endpoint)
                try:
                    reply = await self._post_once(endpoint, path, body)
                except _HttpStatus as exc:
                    if not (self.settings.username and exc.status == 401):
                        raise
                    await self._authenticate(endpoint)
                    reply = await self._post_once(endpoint, path, body)
            except (aiohttp.ClientError, TimeoutError, ValueError, _HttpStatus) as exc:
                problems.append(f"{endpoint}: {type(exc).__name__} {exc}".strip()[:200])
                continue
            self._preferred = self.settings.endpoints.index(endpoint)
            if not isinstance(reply, dict):
                raise EtcdUnavailable(f"{path}: reply is not a JSON object")
            return reply
        raise EtcdUnavailable(f"{path}: no endpoint answered ({'; '.join(problems)})")

    # ---- key/value -----------------------------------------------------------------------------------
    async def get(self, key: str) -> tuple[KeyValue | None, int]:
        """The key (None when absent) and the store's revision."""
        reply = await self.call("/v3/kv/range", {"key": _b64(key)})
        kvs = reply.get("kvs") or []
        return (_kv(kvs[0]) if kvs else None), int(reply["header"].get("revision", 0))

    async def get_prefix(self, prefix: str) -> tuple[list[KeyValue], int]:
        """Every key under `prefix` (sorted by key) and the store's revision."""
        body = {"key": _b64(prefix), "range_end": _b64(prefix_end(prefix)), "sort_order": "ASCEND"}
        reply = await self.call("/v3/kv/range", body)
        return [_kv(k) for k in reply.get("kvs") or []], int(reply["header"].get("revision", 0))

    async def put(self, key: str, value: str, lease: int = 0) -> int:
        """Write one key (attached to `lease` when not 0); returns the new revision."""
        reply = await self.call("/v3/kv/put", {"key": _b64(key), "value": _b64(value), "lease": str(lease)})
        return int(reply["header"].get("revision", 0))

    async def txn(self, compare: Sequence[Compare], success: Sequence[Put | DeletePrefix]) -> bool:
        """Apply `success` atomically if every guard in `compare` holds; True when it did."""
        body = {"compare": [c.body() for c in compare], "success": [op.body() for op in success]}
        reply = await self.call("/v3/kv/txn", body)
        return bool(reply.get("succeeded", False))

    # ---- leases --------------------------------------------------------------------------------------
    async def grant(self, ttl_s: int) -> int:
        """A new lease of `ttl_s` seconds; returns its id."""
        reply = await self.call("/v3/lease/grant", {"TTL": str(ttl_s)})
        if reply.get("error"):
            raise EtcdUnavailable(f"/v3/lease/grant: {str(reply['error'])[:200]}")
        return int(reply["ID"])

    async def keepalive(self, lease: int) -> int:
        """Refresh `lease` once; returns its remaining TTL (0 = the lease no longer exists)."""
        reply = await self.call("/v3/lease/keepalive", {"ID": str(lease)})
        return int((reply.get("result") or {}).get("TTL", 0))

    async def revoke(self, lease: int) -> None:
        """Drop `lease` and every key attached to it."""
        await self.call("/v3/lease/revoke", {"ID": str(lease)})

    # ---- watch ---------------------------------------------------------------------------------------
    async def watch(self, prefix: str, start_revision: int) -> AsyncIterator[list[Event]]:
        """Batches of changes under `prefix` from `start_revision` on, until the stream ends or fails.

        Raises EtcdUnavailable when it cannot be opened or breaks; the caller re-reads and re-watches.
        A stream that stays silent is not an error: etcd sends nothing while nothing changes.
        """
        create = {
            "key": _b64(prefix),
            "range_end": _b64(prefix_end(prefix)),
            "start_revision": str(start_revision),
        }
        headers = {"Authorization": self._token} if self._token else {}
        endpoint = self._endpoints()[0]
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=self.settings.timeout_s)
        try:
            async with self._http().post(
                endpoint + "/v3/watch", json={"create_request": create}, headers=headers, timeout=timeout
            ) as resp:
                if resp.status != 200:
                    raise EtcdUnavailable(f"/v3/watch: HTTP {resp.status}")
                while True:
                    # aiohttp's readline refuses (ValueError) a line over its buffer limit (128 KiB)
                    line = await resp.content.readline()
                    if not line:
                        raise EtcdUnavailable("/v3/watch: stream closed")
                    result = json.loads(line).get("result") or {}
                    if result.get("canceled") or result.get("compact_revision"):
                        raise EtcdUnavailable("/v3/watch: canceled by the server")
                    events = [
                        Event("delete" if e.get("type") == "DELETE" else "put", _kv(e.get("kv") or {}))
                        for e in result.get("events") or []
                    ]
                    if events:
                        yield events
        except (aiohttp.ClientError, ValueError) as exc:
            raise EtcdUnavailable(f"/v3/watch: {type(exc).__name__}") from exc


class _HttpStatus(Exception):
    def __init__(self, status: int, text: str) -> None:
        super().__init__(f"HTTP {status} {text}")
        self.status = status
