"""A deliberate pause of the engine by its client is not a wedge (pure).

Reinforcement-learning stacks pause SGLang to update its weights (`/pause_generation`, `/update_weights_*`,
`/release_memory_occupation`, `/continue_generation`): tokens stop, requests may wait, `/health` fails after 20 s.
While SGLang itself reports the pause (probes/engine.py), the rules that read the progress lease, the rank stacks
and `/health` (`policies.diagnose.LEASE_RULES`) stand aside; what a pause does not explain still counts (a rank
lost, an out-of-memory or GPU fault line, SGLang's own watchdog). A pause longer than `max_pause_s` is a
`pause_overrun`: an incident and an alert, never a restart — killing the server loses what its client pushed
into it, and the client (or an operator) can end the pause with `/continue_generation`.
"""

from __future__ import annotations

from policies.model import Fault, Observation, ProbeSettings, engine_values, make_fault
from policies.window import Window


def paused_engine(w: Window) -> Observation | None:
    """The newest `engine` observation when it says SGLang's engine is paused by its client, else None."""
    engine = w.latest("engine")
    return engine if engine is not None and engine_values(engine).get("paused") else None


def paused_for(engine: Observation, now: float) -> float:
    """Seconds the pause has lasted, as the probe has seen it."""
    since = engine_values(engine).get("paused_since")
    return max(0.0, now - float(since)) if since is not None else 0.0


def pause_overrun(w: Window, settings: ProbeSettings, now: float) -> Fault | None:
    """`pause_overrun`: the engine paused by its client for `max_pause_s` or longer."""
    engine = paused_engine(w)
    if engine is None:
        return None
    lasted = paused_for(engine, now)
    if lasted < settings.max_pause_s:
        return None
    v = engine_values(engine)
    return make_fault(
        "pause_overrun",
        f"engine paused by its client for {lasted:.0f}s (max_pause_s {settings.max_pause_s:g}): "
        "no /continue_generation yet",
        0.9,
        onset=v.get("paused_since"),
        engine={k: v.get(k) for k in ("ready", "ping", "calls", "pause_pending", "memory_released")},
    )
