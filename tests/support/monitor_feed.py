"""A launched simulator adapted to what a probes `Monitor` reads: its tree, GPUs, new log lines, rank PIDs."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from tests.support.sim import FAST_CRASH, Sim, launched_sim

MAX_LOG_READ = 4 * 1024 * 1024


@dataclass(frozen=True)
class SimTree:
    """The TreeView of a simulator launch."""

    main_alive: bool
    missing_ranks: list[str]
    zombie_ranks: list[str]
    rank_cpu_s: dict[str, float]
    rank_states: dict[str, str]  # title → /proc state letter (R, S, D, T, ...)


@dataclass
class MonitorFeed:
    """The readers a Monitor is built with, over one running simulator with `tp` scheduler ranks."""

    sim: Sim
    tp: int
    _offset: int = 0
    _partial: str = ""
    seen: list[str] = field(default_factory=list)

    @property
    def base_url(self) -> str:
        """http://127.0.0.1:PORT"""
        return self.sim.base_url

    def state(self) -> dict[str, Any]:
        """GET /sim/state."""
        return self.sim.state()

    def log_lines(self) -> list[str]:
        """New complete log lines since the last call."""
        with open(self.sim.log_path, "rb") as fh:
            fh.seek(self._offset)
            data = fh.read(MAX_LOG_READ)
        self._offset += len(data)
        text = self._partial + data.decode("utf-8", "replace")
        lines = text.split("\n")
        self._partial = lines.pop()
        self.seen += lines
        return lines

    def _ranks(self) -> dict[str, psutil.Process]:
        return {t.split()[0]: p for t, p in self.sim.tree().items() if t.startswith("sglang::scheduler")}

    def tree(self) -> SimTree:
        """Expected ranks alive / missing / zombie, with their CPU seconds."""
        ranks = self._ranks()
        expected = (
            [f"sglang::scheduler_TP{i}" for i in range(self.tp)] if self.tp > 1 else ["sglang::scheduler"]
        )
        cpu: dict[str, float] = {}
        states: dict[str, str] = {}
        zombie: list[str] = []
        for title, proc in ranks.items():
            with contextlib.suppress(psutil.Error):
                if proc.status() == psutil.STATUS_ZOMBIE:
                    zombie.append(title)
                    continue
                times = proc.cpu_times()
                cpu[title] = times.user + times.system
                states[title] = _state_letter(proc.pid)
        alive = self.sim.proc.poll() is None
        missing = [t for t in expected if t not in ranks]
        return SimTree(alive, missing, zombie, cpu, states)

    def pids(self) -> dict[int, str]:
        """pid -> title of every scheduler rank."""
        return {p.pid: title for title, p in self._ranks().items()}

    def gpus(self) -> list[dict[str, Any]]:
        """The simulator's nvml.json GPUs."""
        path = self.sim.state_dir / "nvml.json"
        if not path.exists():
            return []
        return list(json.loads(path.read_text()).get("gpus", []))


@contextlib.contextmanager
def monitored_sim(
    tmp_path: Path,
    model: str,
    *extra: str,
    tp: int = 2,
    scenario: str = "",
    env: dict[str, str] | None = None,
) -> Iterator[MonitorFeed]:
    """A simulator with metrics and the control API on, not waited for (the Monitor watches it start)."""
    child_env = {**FAST_CRASH, "SGLANG_SIM_CONTROL": "1"}
    if scenario:
        child_env["SGLANG_SIM_SCENARIO"] = scenario
    child_env.update(env or {})
    args = ["--model-path", model, "--tp-size", str(tp), "--enable-metrics", *extra]
    with launched_sim(tmp_path, *args, env=child_env, ready=False) as sim:
        yield MonitorFeed(sim, tp)


def _state_letter(pid: int) -> str:
    """The state letter of /proc/<pid>/stat ("?" when it cannot be read)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            raw = fh.read(4096)
    except OSError:
        return "?"
    fields = raw[raw.rfind(b")") + 2 :].split()
    return fields[0].decode() if fields else "?"
