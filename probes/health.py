"""/health by status code only (the body is always empty in SGLang; it is never read).

SGLang's handler sleeps 1 s, then waits up to SGLANG_HEALTH_CHECK_TIMEOUT (20 s) for any scheduler output, so
the probe's timeout must exceed that (default 35 s) and only one probe may be in flight: a probe that gives up
early leaves an orphan request behind (failure-modes.md P3/P4). Connection refused means the port is not open
yet (weights loading) — startup, not failure — and is reported as such.
"""

from __future__ import annotations

import time

import aiohttp

from policies.model import HealthValues, Observation
from probes.base import auth_headers


async def probe_health(
    session: aiohttp.ClientSession,
    base_url: str,
    timeout_s: float,
    path: str = "/health",
    api_key: str | None = None,
) -> Observation:
    """One GET of `path`; ok only for 200. Values: status (int|None), refused, timeout.

    SGLang never asks for the key on `/health*`; it is sent anyway for proxies in front of it."""
    start = time.monotonic()
    status: int | None = None
    refused = timed_out = False
    error = ""
    try:
        async with session.get(
            f"{base_url}{path}", headers=auth_headers(api_key), timeout=aiohttp.ClientTimeout(total=timeout_s)
        ) as resp:
            status = resp.status
    except aiohttp.ClientConnectorError as exc:
        refused = True
        error = f"connection refused ({exc.os_error.strerror if exc.os_error else 'connect failed'})"
    except TimeoutError:
        timed_out = True
        error = f"no answer within {timeout_s:g}s"
    except (aiohttp.ClientError, OSError) as exc:
        error = f"{type(exc).__name__}: {exc}"[:200]
    end = time.monotonic()
    detail = f"{path} {status if status is not None else error}"
    values: HealthValues = {"status": status, "refused": refused, "timeout": timed_out}
    return Observation("health", end, status == 200, detail, end - start, values)
