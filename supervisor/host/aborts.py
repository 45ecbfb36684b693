"""Abort the requests of a running SGLang server: `POST /abort_request {"abort_all": true}` (policies.abort says
when). SGLang answers 200 at once and finishes each request with an abort (the client gets its error); the
call has a timeout and reads at most `MAX_BODY` bytes of the answer."""

from __future__ import annotations

import aiohttp

from probes.base import auth_headers, read_capped

MAX_BODY = 64 * 1024


async def abort_all(base_url: str, api_key: str | None, timeout_s: float) -> str:
    """'' when SGLang took the abort, else why not (one line)."""
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as session,
            session.post(
                f"{base_url.rstrip('/')}/abort_request",
                json={"abort_all": True},
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
