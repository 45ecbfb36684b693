"""Probe schedule and thresholds; the defaults are the documented product defaults."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ProbeSettings:
    """How often each probe runs, how long it may take, and when silence becomes a fault."""

    health_period_s: float = 10.0
    health_timeout_s: float = 35.0  # above SGLang's 20 s SGLANG_HEALTH_CHECK_TIMEOUT (P3/P4)
    health_failures: int = 3
    canary_period_s: float = 300.0
    canary_timeout_s: float = 60.0
    canary_max_tokens: int = 256
    stream_canary_concurrency: int = 32
    stream_canary_period_s: float = 1800.0
    stall_after_s: float = 20.0
    metrics_period_s: float = 5.0
    metrics_max_bytes: int = 4 * 1024 * 1024
    stacks_budget_s: float = 10.0
    startup_budget_s: float = 1800.0
    startup_silence_s: float = 300.0
    expected_tool_parser: str | None = None  # None = skip the config check for it
    expected_reasoning_parser: str | None = None  # None = no reasoning canary, no config check for it
    unresponsive_after_s: float = 120.0  # 503/timeouts with no progress this long -> health_unresponsive
