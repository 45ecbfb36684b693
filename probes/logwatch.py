"""Log signatures and log progress: the launcher's new lines, classified with `policies.signatures`.

During startup any progress line (shard %, CUDA graph capture, DeepGEMM JIT, weight load, KV allocation) extends
the budget; steady-state `Prefill batch` / `Decode batch` lines count as engine progress for the lease.
"""

from __future__ import annotations

from dataclasses import dataclass

from policies.model import LogHit, LogsValues, Observation
from policies.signatures import (
    DECODE_PROGRESS,
    PREFILL_PROGRESS,
    READY,
    STARTUP_PROGRESS,
    classify,
)

MAX_HITS = 20  # per observation: a crash loop or a retract storm must not bloat the window
MAX_LINE = 400


@dataclass
class LogWatch:
    """What the logs have shown during this launch."""

    last_line_at: float | None = None
    last_progress_at: float | None = None
    progress_line: str | None = None
    ready: bool = False

    def reset(self, now: float) -> None:
        """A new launch: nothing seen yet."""
        self.last_line_at = self.last_progress_at = None
        self.progress_line, self.ready = None, False
        del now

    def observe(self, lines: list[str], now: float) -> Observation:
        """Classify the new lines (probe `logs`)."""
        hits: list[LogHit] = []
        batches = {PREFILL_PROGRESS: 0, DECODE_PROGRESS: 0}
        dropped = 0
        for line in lines:
            sig = classify(line)
            if sig is None:
                continue
            if sig.kind in batches:
                batches[sig.kind] += 1
                self.last_progress_at = now
            elif sig.kind in (STARTUP_PROGRESS, READY):
                self.last_progress_at = now
                self.progress_line = line.strip()[:MAX_LINE]
                self.ready = self.ready or sig.kind == READY
            elif len(hits) < MAX_HITS:
                hits.append(
                    {"name": sig.name, "kind": sig.kind, "tag": sig.tag, "line": line.strip()[:MAX_LINE]}
                )
            else:
                dropped += 1
        if lines:
            self.last_line_at = now
        fatal = [h for h in hits if h["kind"] != "warning"]
        if fatal:
            detail = f"{fatal[0]['kind']}: {fatal[0]['line'][:160]}"
        else:
            detail = f"{len(lines)} new lines, {sum(batches.values())} batch lines"
        values: LogsValues = {
            "hits": hits,
            "dropped_hits": dropped,
            "lines": len(lines),
            "prefill_batches": batches[PREFILL_PROGRESS],
            "decode_batches": batches[DECODE_PROGRESS],
            "last_line_at": self.last_line_at,
            "last_progress_at": self.last_progress_at,
            "progress_line": self.progress_line,
            "ready": self.ready,
        }
        return Observation("logs", now, not fatal, detail, 0.0, values)
