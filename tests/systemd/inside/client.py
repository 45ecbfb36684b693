"""A client of the SGLang server that never stops asking: one chat request after the other until `STOP` exists.

Run inside the container (`python3 client.py OUT_DIR`): each answer must be a 200 with a completion; it writes
`OUT_DIR/result.json` ({"sent", "failed", "errors"}) when `OUT_DIR/STOP` appears, and `OUT_DIR/started` once
its first request succeeded.
"""

from __future__ import annotations

import json
import sys
import urllib.request
from pathlib import Path

URL = "http://127.0.0.1:30000/v1/chat/completions"
BODY = json.dumps(
    {
        "model": "moonshotai/Kimi-K2.5",
        "messages": [{"role": "user", "content": "Say hello."}],
        "max_tokens": 8,
    }
).encode()


def ask() -> str | None:
    """One request; None when it was answered, else what went wrong."""
    request = urllib.request.Request(URL, data=BODY, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            if not json.loads(resp.read()).get("choices"):
                return "an answer without choices"
    except (OSError, ValueError) as exc:
        return repr(exc)
    return None


def main(out: Path) -> None:
    sent, errors = 0, []
    while not (out / "STOP").exists():
        error = ask()
        sent += 1
        if error is None:
            (out / "started").touch()
        else:
            errors.append(error)
    (out / "result.json").write_text(json.dumps({"sent": sent, "failed": len(errors), "errors": errors[:5]}))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
