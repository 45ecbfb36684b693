"""Forensics' stack dumps: a rank another py-spy holds at that moment is dumped on the second try."""

from __future__ import annotations

import pytest

from supervisor.host import forensics

pytestmark = pytest.mark.unit

EPERM = "Error: Failed to get stack traces\n\nCaused by:\n    0: Failed to suspend process\n    1: EPERM"


async def test_a_rank_held_by_another_py_spy_is_dumped_on_the_second_try(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Seen in the systemd tier: the stacks probe's own dump still held the rank when the forensics' began."""
    answers = [("", EPERM), ("Process 156: sglang::scheduler_TP0\nThread 1 (idle)\n", "")]
    calls: list[float] = []

    async def fake_dump(tool: str, pid: int, timeout_s: float) -> tuple[str, str]:
        calls.append(timeout_s)
        return answers.pop(0)

    monkeypatch.setattr(forensics, "py_spy_path", lambda: "/usr/bin/py-spy")
    monkeypatch.setattr(forensics, "dump", fake_dump)
    monkeypatch.setattr(forensics, "TRACED_RETRY_S", 0.01)
    assert (await forensics.dump_stack(156, 5.0)).startswith("Process 156:")
    assert len(calls) == 2 and calls[1] < 5.0


async def test_any_other_failure_is_reported_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[float] = []

    async def fake_dump(tool: str, pid: int, timeout_s: float) -> tuple[str, str]:
        calls.append(timeout_s)
        return "", "Error: No such process"

    monkeypatch.setattr(forensics, "py_spy_path", lambda: "/usr/bin/py-spy")
    monkeypatch.setattr(forensics, "dump", fake_dump)
    text = await forensics.dump_stack(156, 5.0)
    assert text == "py-spy dump of pid 156 failed: Error: No such process" and len(calls) == 1
