"""SGLang's hard scheduler watchdog, as the simulated scheduler runs it beside each DP rank's engine."""

from __future__ import annotations

import os
import signal
import time
from typing import TYPE_CHECKING

from simulator.logs import log

if TYPE_CHECKING:
    from simulator.engine import Engine


def watchdog_loop(engine: Engine) -> None:
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
