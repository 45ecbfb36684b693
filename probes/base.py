"""Helpers every HTTP probe shares. The observation types live in `policies.model`."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from aiohttp import ClientResponse


async def read_capped(resp: ClientResponse, limit: int) -> bytes:
    """At most `limit` bytes of a response body; longer bodies are cut, never buffered whole."""
    return await resp.content.read(limit)
