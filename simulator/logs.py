"""SGLang-shaped log lines: `[%Y-%m-%d %H:%M:%S{ prefix}] message` on stderr, flushed at once."""

from __future__ import annotations

import sys
import threading
import time

_lock = threading.Lock()


def log(message: str, prefix: str = "") -> None:
    """Write one SGLang-style line (multi-line messages keep SGLang's single header)."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime())
    head = f"[{stamp}{' ' + prefix if prefix else ''}] "
    with _lock:
        sys.stderr.write(head + message + "\n")
        sys.stderr.flush()


def uvicorn(message: str) -> None:
    """A uvicorn line, as SGLang's log shows them: `[time] INFO:     ...`."""
    log(f"INFO:     {message}")


def rank_prefix(dp_rank: int | None, tp_rank: int, tp_size: int, pp_rank: int = 0, pp_size: int = 1) -> str:
    """The log prefix of a scheduler rank (`DP0 TP3`), empty for a single rank."""
    parts: list[str] = []
    if dp_rank is not None:
        parts.append(f"DP{dp_rank}")
    if pp_size > 1:
        parts.append(f"PP{pp_rank}")
    if tp_size > 1:
        parts.append(f"TP{tp_rank}")
    return " ".join(parts)


def scheduler_title(
    dp_rank: int | None, tp_rank: int, tp_size: int, pp_rank: int = 0, pp_size: int = 1
) -> str:
    """The process title SGLang gives a scheduler (`sglang::scheduler_DP0_TP3`)."""
    prefix = rank_prefix(dp_rank, tp_rank, tp_size, pp_rank, pp_size)
    return "sglang::scheduler" + ("_" + prefix.replace(" ", "_") if prefix else "")
