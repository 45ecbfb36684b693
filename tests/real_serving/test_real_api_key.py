"""The daemon against a real SGLang server launched with `--api-key`: canaries authenticate, the key stays secret."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.real_serving.support import READY_S, real_deployment, serving

KEY = "sk-real-serving-test-7f3a9c"


def _not_refused(s: dict[str, Any]) -> bool:
    """Serving yet; a canary refused with 401 fails the wait at once instead of waiting out the deadline."""
    detail = str(((s.get("probes") or {}).get("probes") or {}).get("canary_tool", {}).get("detail", ""))
    assert "401" not in detail, f"the canary was refused: {detail}"
    return serving(s)


def test_api_key_server_serves_and_the_key_never_shows(
    tmp_path: Path, serving_python: Path, models: Path
) -> None:
    """--api-key KEY: config check and canary pass with the key; KEY is absent from /status, incidents, logs."""
    with real_deployment(
        tmp_path,
        tp=1,
        python=serving_python,
        models=models,
        parsers=("qwen", None),
        extra_args=["--api-key", KEY],
    ) as dep:
        dep.start()
        s = dep.wait(_not_refused, timeout=READY_S, what="serving with the key presented")
        assert s["probes"]["probes"]["canary_tool"]["values"]["verdict"] == "pass"
        shown = json.dumps(dep.status()) + json.dumps(dep.incidents())
        assert KEY not in shown
        assert KEY not in (tmp_path / "daemon.log").read_text(errors="replace")
        for path in (tmp_path / "state").rglob("*"):
            if path.is_file():
                assert KEY not in path.read_text(errors="replace"), path
