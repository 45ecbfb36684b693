"""What SGLang itself says about a deliberate pause of its engine: `/ready`, `/ping` and its own control calls.

Reinforcement-learning clients pause generation to push new weights (`POST /pause_generation` in any mode, then
`/update_weights_*`, maybe `/release_memory_occupation`, then `/continue_generation`). SGLang 0.5.23 reports it
only this way (docs/contracts.md, "Engine pause"):

- `GET /ready` is 503 while the pause flag is set or the server is not healthy; `GET /ping` is 200 while it is
  healthy, pause or not. Both are flag reads that answer at once, so `/ready` 503 with `/ping` 200 is a pause.
- A `/health` issued during a pause waits like any request and fails after SGLang's 20 s health timeout, which
  marks the server unhealthy: `/ping` is 503 from then on. SGLang's HTTP middleware counts every response by
  endpoint and status (`sglang:http_responses_total`), so a `/pause_generation` answered 200 more recently than
  a `/continue_generation` still says paused then.
- `/ready` 200 always means not paused.

Nothing is sent to the engine: two flag reads per metrics scrape (`/ping` only when `/ready` is not 200).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import aiohttp

from policies.model import EngineValues, Observation
from probes.base import auth_headers
from probes.progress import Sample

RESPONSES = "sglang:http_responses_total"
CONTROL_CALLS = {
    "/pause_generation": "pause",
    "/continue_generation": "continue",
    "/release_memory_occupation": "release",
    "/resume_memory_occupation": "resume",
}


def control_calls(samples: list[Sample]) -> dict[str, float]:
    """Successful control calls by name (`pause`, `continue`, `release`, `resume`), summed over methods."""
    calls = dict.fromkeys(CONTROL_CALLS.values(), 0.0)
    for s in samples:
        name = CONTROL_CALLS.get(s.labels.get("endpoint", ""))
        if s.name == RESPONSES and name is not None and s.labels.get("status_code") == "200":
            calls[name] += s.value
    return calls


async def status_of(
    session: aiohttp.ClientSession, base_url: str, path: str, timeout_s: float, api_key: str | None
) -> int | None:
    """The status code of one GET (its body is not read); None when the server does not answer in time."""
    try:
        async with session.get(
            f"{base_url}{path}", headers=auth_headers(api_key), timeout=aiohttp.ClientTimeout(total=timeout_s)
        ) as resp:
            return resp.status
    except (aiohttp.ClientError, TimeoutError, OSError):
        return None


async def ready_and_ping(
    session: aiohttp.ClientSession, base_url: str, timeout_s: float, api_key: str | None
) -> tuple[int | None, int | None]:
    """(`/ready`, `/ping`) status codes; `/ping` is asked only when `/ready` is not 200."""
    ready = await status_of(session, base_url, "/ready", timeout_s, api_key)
    if ready == 200:
        return ready, None
    return ready, await status_of(session, base_url, "/ping", timeout_s, api_key)


@dataclass
class EngineTracker:
    """State across scrapes: the control calls seen, which of each pair came last, since when paused."""

    calls: dict[str, float] | None = None
    newer: dict[str, bool] = field(default_factory=dict)  # "pause" over "continue", "release" over "resume"
    paused_since: float | None = None

    def reset(self) -> None:
        """A new launch: nothing known."""
        self.calls, self.newer, self.paused_since = None, {}, None

    def update(
        self,
        samples: list[Sample] | None,
        ready: int | None,
        ping: int | None,
        now: float,
        latency_s: float | None = None,
    ) -> Observation:
        """Fold one scrape's control calls and the `/ready`, `/ping` codes into an `engine` observation."""
        if samples is not None:
            self._fold(control_calls(samples))
        pending = self.newer.get("pause", False)
        paused = ready == 503 and (ping == 200 or pending)
        if not paused:
            self.paused_since = None
        elif self.paused_since is None:
            self.paused_since = now
        values: EngineValues = {
            "ready": ready,
            "ping": ping,
            "calls": dict(self.calls or {}),
            "pause_pending": pending,
            "paused": paused,
            "paused_since": self.paused_since,
            "memory_released": self.newer.get("release", False),
        }
        if paused:
            detail = f"engine paused by its client for {now - (self.paused_since or now):.0f}s"
        elif ready is None:
            detail = "/ready did not answer"
        else:
            detail = f"/ready {ready}" + (f", /ping {ping}" if ping is not None else "")
        return Observation("engine", now, ready is not None, detail, latency_s, values)

    def _fold(self, calls: dict[str, float]) -> None:
        """Which call of each pair is the newer: the one whose count moved alone (both moving: unknown, so
        not paused on this signal); on the first scrape of a launch, the one counted more often."""
        before = self.calls
        for on, off in (("pause", "continue"), ("release", "resume")):
            if before is None:
                self.newer[on] = calls[on] > calls[off]
                continue
            moved_on, moved_off = calls[on] != before[on], calls[off] != before[off]
            if moved_on != moved_off:
                self.newer[on] = moved_on
            elif moved_on:
                self.newer[on] = False
        self.calls = calls
