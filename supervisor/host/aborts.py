"""Abort the requests of a running SGLang server: `POST /abort_request {"abort_all": true}`, or `{"rid": …}` for
each request named (policies.abort says when). SGLang answers 200 at once (to an unknown id too) and finishes each
request with an abort (the client gets its error); each call has a timeout and reads at most `MAX_BODY` bytes of
the answer."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import aiohttp

from probes.base import auth_headers, read_capped

MAX_BODY = 64 * 1024


async def abort_all(base_url: str, api_key: str | None, timeout_s: float) -> str:
    """'' when SGLang took the abort, else why not (one line)."""
    return await _abort(base_url, api_key, timeout_s, {"abort_all": True})


async def abort_rids(base_url: str, api_key: str | None, timeout_s: float, rids: Sequence[str]) -> str:
    """Abort each request named, one call each: '' when SGLang took every one, else why not for the first refused."""
    for rid in rids:
        failed = await _abort(base_url, api_key, timeout_s, {"rid": rid})
        if failed:
            return f"{rid}: {failed}"
    return ""


async def _abort(base_url: str, api_key: str | None, timeout_s: float, request: dict[str, Any]) -> str:
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as session,
            session.post(
                f"{base_url.rstrip('/')}/abort_request",
                json=request,
                headers=auth_headers(api_key),
            ) as resp,
        ):
            body = await read_capped(resp, MAX_BODY)
            if resp.status == 200:
                return ""
            return f"HTTP {resp.status}: {body[:160].decode('utf-8', 'replace')}"
    except TimeoutError:
        return f"no answer within {timeout_s:g}s"
    except (aiohttp.ClientError, OSError) as exc:
        return f"{type(exc).__name__}: {exc}"[:200]
