"""Seconds from a fault to its alert firing in a real Prometheus: figures, no asserts.

The monitoring tier's world (tests/support/monitored.py): the installed daemon over one simulated host with a
server per alert cause, every cause injected at once, a real Prometheus scraping it with the packaged scrape
example and rules (each `for:` of N minutes read as 2·N seconds, nothing else changed), a real Alertmanager; then
the daemon stopped and started again (SglangSupervisorDown, SglangSupervisorAbsent). Once per scrape interval:
1 s (the tier's) and 15 s (the packaged `prometheus.yml`'s, evaluation at the same interval).

Per alert: seconds from its fault (`Cause.started`: the injection, the daemon's start for a cause present at
launch, the daemon's stop) to the first evaluation that has it firing with the cause's labels. *Production* is
the 15 s figure with the shortened `for:` replaced by the rule's own (the figure minus the shortened `for:`, plus
the packaged one): what a user of the packaged files waits, the detection and scrapes included.

Run: ``.venv/bin/python -m benchmarks.bench_prometheus [--intervals 1 15]`` (a few minutes each; needs root for
the tmpfs state_dir).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from benchmarks.common import parser, say, wait_for, write_result
from tests.support.monitored import World, monitored_world
from tests.support.prometheus import FOR_S_PER_MINUTE, rule_for_s

CHAINS_S = 600.0
DOWN_S = 300.0


def first_firing(world: World, alert: str, labels: dict[str, str]) -> float | None:
    """The Unix time of the first evaluation that had `alert` with `labels` firing (None: never)."""
    spans = world.prometheus.firing_spans(alert, labels, world.started)
    return spans[0][0] if spans else None


def stop_and_restart(world: World, interval_s: float) -> None:
    """Stop the daemon until both of its alerts fire, then start it again."""
    world.causes.stop_daemon()
    for alert in ("SglangSupervisorDown", "SglangSupervisorAbsent"):
        labels = world.causes.causes[alert].labels

        def fired(alert: str = alert, labels: dict[str, str] = labels) -> float | None:
            return first_firing(world, alert, labels)

        wait_for(fired, DOWN_S + 4 * interval_s)
    world.causes.start_daemon()


def measure(interval_s: float) -> dict[str, Any]:
    """One run of the world at `interval_s`: per alert, fault → firing."""
    with tempfile.TemporaryDirectory(prefix="bench-prometheus-") as tmp:
        # SglangServerDown's cause must outlast its shortened for: (20 s) by a few intervals.
        slow_start_s = 40 + 4 * interval_s
        with monitored_world(Path(tmp), interval_s=interval_s, slow_start_s=slow_start_s) as world:
            world.causes.join(CHAINS_S)
            stop_and_restart(world, interval_s)
            rules = yaml.safe_load((world.bundle / "alerts.yaml").read_text())["groups"][0]["rules"]
            packaged_for = {r["alert"]: rule_for_s(r) for r in rules}
            out: dict[str, Any] = {"errors": world.causes.errors(), "alerts": {}}
            for name, cause in world.causes.causes.items():
                fired = first_firing(world, name, cause.labels)
                out["alerts"][name] = {
                    "for_s": packaged_for[name],
                    "test_for_s": packaged_for[name] / 60 * FOR_S_PER_MINUTE,
                    "fault_to_firing_s": round(fired - cause.started, 1) if fired and cause.started else None,
                }
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Measure each interval; print one row per alert."""
    p = parser(__doc__)
    p.add_argument("--intervals", type=float, nargs="+", default=[1.0, 15.0])
    args = p.parse_args(argv)
    runs: dict[str, Any] = {}
    for interval in args.intervals:
        say(f"== scrape and evaluation every {interval:g} s")
        started = time.monotonic()
        runs[f"{interval:g}"] = {**measure(interval), "wall_s": round(time.monotonic() - started)}
    last = f"{args.intervals[-1]:g}"
    print(f"{'alert':40} {'for':>6} " + " ".join(f"{k + ' s':>8}" for k in runs) + f" {'production':>11}")
    for name, row in runs[last]["alerts"].items():
        figures = [runs[k]["alerts"][name]["fault_to_firing_s"] for k in runs]
        base = row["fault_to_firing_s"]
        production = None if base is None else round(base - row["test_for_s"] + row["for_s"], 1)
        row["production_s"] = production
        cells = " ".join(f"{'-' if f is None else f:>8}" for f in figures)
        print(f"{name:40} {row['for_s']:>5g}s {cells} {'-' if production is None else production:>11}")
    for key, run in runs.items():
        if run["errors"]:
            say(f"{key} s: causes that failed: {sorted(run['errors'])}")
    write_result("prometheus", runs)
    return runs


if __name__ == "__main__":
    main()
