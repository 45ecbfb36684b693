"""RealHost.wait_exit: the loop's sleep ends when a process of the tree exits or a probe finishes, not later."""

from __future__ import annotations

import asyncio
import subprocess
import sys

from supervisor.host.gpu import NoneBackend
from supervisor.loop.clock import SystemClock
from supervisor.loop.host import RealHost

LONG_S = 30.0  # a sleep no test here waits out: each ends by an event long before


def _sleeper() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


async def test_an_exit_ends_the_sleep_and_its_pidfd_is_forgotten() -> None:
    """Two waits on a live process reuse one pidfd; its exit ends the second at once and frees the pidfd."""
    host, clock = RealHost(NoneBackend()), SystemClock()
    proc = _sleeper()
    try:
        await host.wait_exit([proc.pid], 0.05, clock)
        assert list(host._pidfds) == [proc.pid]
        waiting = asyncio.ensure_future(host.wait_exit([proc.pid], LONG_S, clock))
        await asyncio.sleep(0.05)
        assert not waiting.done()
        proc.kill()
        await asyncio.wait_for(waiting, 10)
        assert host._pidfds == {} and host._exit_waiters == {}
    finally:
        proc.kill()
        proc.wait()


async def test_a_gone_pid_returns_at_once_and_a_set_event_wakes() -> None:
    """A pid that already exited does not sleep; a probe finishing (the event) ends the sleep too."""
    host, clock = RealHost(NoneBackend()), SystemClock()
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    await asyncio.wait_for(host.wait_exit([gone.pid], LONG_S, clock), 10)
    proc = _sleeper()
    try:
        ready = asyncio.Event()
        waiting = asyncio.ensure_future(host.wait_exit([proc.pid], LONG_S, clock, ready))
        await asyncio.sleep(0.05)
        ready.set()
        await asyncio.wait_for(waiting, 10)
        assert host._exit_waiters.get(proc.pid, set()) == set(), "the finished wait left no waiter behind"
    finally:
        proc.kill()
        proc.wait()
