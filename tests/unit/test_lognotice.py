"""Catalogued lines of a log flood are kept aside by shape; a flood of unique lines is counted, not classified."""

from __future__ import annotations

import pytest

from supervisor.host.lognotice import MAX_NEW_SHAPES, NotableLines


def _chunk(lines: list[bytes]) -> bytes:
    return b"".join(line + b"\n" for line in lines)


@pytest.mark.unit
def test_a_crash_line_in_a_repeated_flood_is_kept_with_its_sequence() -> None:
    """Batch lines are routine; the crash line among them is kept, numbered, once per chunk."""
    batch = [b"[TP0] Decode batch. #running-req: %d, #token: 4096" % i for i in range(1000)]
    crash = b"[TP3] Subprocess scheduler_3 (pid=4242) crashed with exit code -9"
    lines = [*batch[:500], crash, *batch[500:]]
    notable = NotableLines()
    notable.scan(_chunk(lines), lines, 10_000)
    assert list(notable.lines) == [(10_500, crash)]
    assert notable.between(0, 10_500) == [] and notable.between(10_500, 10_501) == [crash]


@pytest.mark.unit
def test_a_flood_of_unique_shapes_is_bounded_and_counted() -> None:
    """More unseen shapes in one chunk than the budget: the chunk counts as unscanned, the work stays bounded."""
    lines = [f"line {'x' * (i % 50)} {'y' * (i // 50)} zzz".encode() for i in range(4 * MAX_NEW_SHAPES)]
    notable = NotableLines()
    notable.scan(_chunk(lines), lines, 0)
    assert notable.unscanned_lines == len(lines)
    assert not notable.lines
