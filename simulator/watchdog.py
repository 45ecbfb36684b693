"""SGLang's hard scheduler watchdog, as the simulated scheduler runs it beside each DP rank's engine."""

from __future__ import annotations

import os
import signal
import time
from typing import Protocol

from simulator.logs import log
from simulator.request import Req


class Watched(Protocol):
    """What the watchdog reads of the engine it watches."""

    watchdog_timeout: float
    watchdog_label: str
    forward_ct: int
    batch_active_since: float | None
    stopping: bool
    wedged: str
    dead: bool
    prefix: str
    running: list[Req]
    rank_pids: list[int]


def watchdog_loop(engine: Watched) -> None:
    """SGLang's hard scheduler watchdog: a batch with no forward progress for the timeout → SIGQUIT."""
    period = max(engine.watchdog_timeout / 2, 0.5)
    last_ct, last_change = engine.forward_ct, time.monotonic()
    while not engine.stopping:
        time.sleep(min(period, 1.0))
        if engine.forward_ct != last_ct or engine.batch_active_since is None:
            last_ct, last_change = engine.forward_ct, time.monotonic()
            continue
        if engine.wedged == "watchdog_disabled_silent_wedge" or engine.dead:
            continue  # disabled by the flag / the rank whose watchdog would fire died with it
        if time.monotonic() - last_change >= engine.watchdog_timeout:
            prefix = engine.prefix
            log(f"Scheduler debug info: scheduler.cur_batch.batch_size()={len(engine.running)}", prefix)
            for pid in engine.rank_pids:
                log(f"Pyspy dump for PID {pid}", prefix)
            log(
                f"Scheduler watchdog timeout (self.watchdog_timeout={engine.watchdog_label}, self.soft=False)",
                prefix,
            )
            time.sleep(5)
            os.kill(os.getpid(), signal.SIGQUIT)
            return
