"""Helpers every HTTP probe shares. The observation types live in `policies.model`."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from aiohttp import ClientResponse


async def read_capped(resp: ClientResponse, limit: int) -> bytes:
    """The body up to its end or `limit` bytes, whichever comes first; a longer body is cut, never buffered
    whole (`len(result) == limit` says it may have been cut). A single `read(limit)` would return only what
    has arrived so far and split a slow or chunked body."""
    body = bytearray()
    while len(body) < limit:
        chunk = await resp.content.read(limit - len(body))
        if not chunk:
            break
        body += chunk
    return bytes(body)


def auth_headers(api_key: str | None) -> dict[str, str]:
    """`Authorization: Bearer <key>` when the server requires a key (SGLang's `--api-key`), else nothing."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def error_message(raw: bytes, limit: int = 240) -> str:
    """What an error answer says, in one line of at most `limit` characters: SGLang's `message` (at the top or
    under `error`), else the body's text; '' for an empty body."""
    text = raw.decode(errors="replace")
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if isinstance(data, dict):
        inner = data.get("error")
        found = data.get("message") or (inner.get("message") if isinstance(inner, dict) else inner)
        if isinstance(found, str):
            text = found
    line = " ".join("".join(c if c.isprintable() else " " for c in text).split())
    return line[:limit]
