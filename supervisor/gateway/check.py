"""`check-config` asks the configured gateway once, when it can reach it: the key, and that it is a gateway."""

from __future__ import annotations

import asyncio
from pathlib import Path

from supervisor.config import Config
from supervisor.gateway.client import GatewayClient, GatewayError


def gateway_warnings(config: Config) -> list[str]:
    """One line when `[gateway]` refuses the key or is not a gateway's `/workers`, or cannot be reached now."""
    gw = config.gateway
    if gw is None:
        return []
    key = Path(gw.admin_key_file).read_text().strip() or None if gw.admin_key_file else None

    async def ask() -> str:
        client = GatewayClient(gw.url, key, gw.timeout_s)
        try:
            await client.workers()
        except GatewayError as exc:
            if exc.kind == "unreachable":
                return f"gateway {gw.url} did not answer ({exc}): run keeps supervising and retries it"
            return f"gateway {gw.url}: {exc}; run keeps supervising and shows the error in /status"
        finally:
            await client.aclose()
        return ""

    line = asyncio.run(ask())
    return [line] if line else []
