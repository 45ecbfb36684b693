"""The faults the canaries decide on their own (pure): a parser misconfiguration and a leak under streaming."""

from __future__ import annotations

from policies.model import Fault, canary_values, make_fault
from policies.window import Window


def parser_fault(w: Window) -> Fault | None:
    """`parser_misconfig`: a definitive failure of the config check or a tool/reasoning canary."""
    for probe in ("config_check", "canary_tool", "canary_reasoning"):
        obs = w.latest(probe)
        if obs is not None and canary_values(obs).get("verdict") == "fail":
            return make_fault(
                "parser_misconfig",
                f"{probe}: {obs.detail}",
                0.95 if probe != "config_check" else 0.9,
                onset=obs.at,
                probe=probe,
                values=dict(obs.values),
            )
    return None


def stream_leak_fault(w: Window) -> Fault | None:
    """`stream_leak`: markup leaks only under concurrent streaming (the plan alerts, never restarts)."""
    obs = w.latest("canary_stream")
    if obs is None or canary_values(obs).get("verdict") != "fail":
        return None
    return make_fault(
        "stream_leak", f"canary_stream: {obs.detail}", 0.9, onset=obs.at, canary_stream=dict(obs.values)
    )
