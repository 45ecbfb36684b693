"""SGLang's error responses and the JSON request body reader, shared by the simulator's handlers."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

MAX_BODY = 32 * 1024 * 1024


def error_body(status: int, message: str, err_type: str = "BadRequestError") -> dict[str, Any]:
    """SGLang's OpenAI-style ErrorResponse."""
    return {"object": "error", "message": message, "type": err_type, "param": None, "code": status}


def error(status: int, message: str, err_type: str = "BadRequestError") -> web.Response:
    """An error response in SGLang's shape."""
    return web.json_response(error_body(status, message, err_type), status=status)


async def read_json(request: web.Request) -> Any | web.Response:
    """The decoded JSON body, or the 400 for a wrong content type or invalid JSON (413 propagates)."""
    if request.content_type != "application/json":
        return error(400, f"Unsupported Content-Type {request.content_type!r}; use application/json")
    try:
        raw = await request.read()
        return json.loads(raw)
    except web.HTTPRequestEntityTooLarge:
        raise
    except (ValueError, UnicodeDecodeError) as exc:
        return error(400, f"Invalid JSON body: {exc}")
