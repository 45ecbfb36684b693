"""SGLang's API-key rule: with `--api-key`, every endpoint but `/health*`, `/ready*` and `/metrics` needs
`Authorization: Bearer <key>` (401 `{"error": "Unauthorized"}` otherwise). Admin endpoints (here:
`/flush_cache`, `/abort_request`) take the `--admin-api-key` when one is set, else the API key. `/sim/*` is the simulator's
own control plane and stays open."""

from __future__ import annotations

import hmac

from aiohttp import web

OPEN_PREFIXES = ("/health", "/ready", "/metrics", "/sim/")
ADMIN_PATHS = ("/flush_cache", "/abort_request")


def _bearer(request: web.Request, key: str) -> bool:
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(token.encode(), key.encode())


def denied(request: web.Request, api_key: str | None, admin_api_key: str | None) -> web.Response | None:
    """The 401 answer when the request lacks the key its endpoint needs, else None."""
    if request.method == "OPTIONS" or request.path.startswith(OPEN_PREFIXES):
        return None
    key = (admin_api_key or api_key) if request.path in ADMIN_PATHS else api_key
    if key is None or _bearer(request, key):
        return None
    return web.json_response({"error": "Unauthorized"}, status=401)
