"""Spot the log lines that matter in a flood, at the speed of the flood.

A server can print tens of MB/s; the launcher's ring keeps only the last lines, and the monitor reads it once a
second, so a crash line followed by a flood would be gone before anyone classified it. Classifying every line
in Python cannot keep up, but floods repeat themselves: lines are reduced to a *shape* (digits and hex letters
removed: counters, rids, addresses), each distinct shape is classified once with `policies.signatures`, and
the first line of each notable shape in a chunk is kept with its sequence number. The per-line work is a
C-level split, translate and set; at most `MAX_NEW_SHAPES` unseen shapes are classified per chunk, the rest of
such a chunk (a flood of unique lines) counts as unscanned.
"""

from __future__ import annotations

from collections import deque

from policies.signatures import DECODE_PROGRESS, PREFILL_PROGRESS, classify

_VARIABLE = b"0123456789abcdef"
MAX_NEW_SHAPES = 256
MAX_SHAPES = 8192
KEEP = 256
_ROUTINE = (PREFILL_PROGRESS, DECODE_PROGRESS)  # batch lines: only needed now and then, never each one


class NotableLines:
    """The recent catalogued lines (errors, warnings, startup progress, readiness) by sequence number."""

    def __init__(self, keep: int = KEEP) -> None:
        self.lines: deque[tuple[int, bytes]] = deque(maxlen=keep)
        self.unscanned_lines = 0
        self._shapes: dict[bytes, bool] = {}

    def scan(self, chunk: bytes, lines: list[bytes], first_seq: int) -> None:
        """Note the catalogued lines among `lines` (the complete lines of `chunk`, numbered from `first_seq`)."""
        shapes = chunk.translate(None, _VARIABLE).split(b"\n")
        distinct = set(shapes[: len(lines)])
        unseen = [s for s in distinct if s not in self._shapes]
        if len(unseen) > MAX_NEW_SHAPES:
            self.unscanned_lines += len(lines)
            unseen = unseen[:MAX_NEW_SHAPES]
        if len(self._shapes) + len(unseen) > MAX_SHAPES:
            self._shapes.clear()
        for shape in unseen:
            index = shapes.index(shape)
            sig = classify(lines[index].decode("utf-8", "replace"))
            self._shapes[shape] = sig is not None and sig.kind not in _ROUTINE
        notable = sorted(shapes.index(s) for s in distinct if self._shapes.get(s))
        self.lines.extend((first_seq + i, lines[i]) for i in notable)

    def between(self, start: int, end: int) -> list[bytes]:
        """Kept lines with `start <= seq < end`, in order."""
        return [line for seq, line in self.lines if start <= seq < end]
