"""A server launched with an alias SGLang accepts for its family's parser serves as configured."""

from __future__ import annotations

from pathlib import Path

from tests.support.daemon import deployment


def test_qwen25_on_a_qwen2_5_model_serves_without_a_parser_fix(tmp_path: Path) -> None:
    """`--tool-call-parser qwen25` is `qwen`: no parser_misconfig, no relaunch, the argv is kept."""
    with deployment(tmp_path, model="Qwen/Qwen2.5-7B-Instruct", parsers=("qwen25", None)) as dep:
        dep.start()
        s = dep.wait(
            lambda s: s.get("state") == "serving" and "config_check" in s["probes"]["probes"],
            what="serving, parsers checked",
        )
        assert s["probes"]["probes"]["config_check"]["ok"], s["probes"]["probes"]["config_check"]
        assert s["last_incident"] is None and s["restarts"] == 0
        assert s["argv"][s["argv"].index("--tool-call-parser") + 1] == "qwen25"
