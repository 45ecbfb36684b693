"""`make bench`: every benchmark in turn, then ONE table (`benchmarks/table.py`) with every row of the fault table.

Run: ``.venv/bin/python -m benchmarks.run_all [--quick]`` (`--quick` is passed to each benchmark). Each one also
writes `benchmarks/results/<name>.json`; the table goes to stdout and `benchmarks/results/summary.json`, with the
host's load average before and after (the figures are only as quiet as the machine).
"""

from __future__ import annotations

import os
from typing import Any

from benchmarks import bench_baselines, bench_core, bench_detection, bench_false, bench_footprint, table
from benchmarks.common import parser, say, write_result


def summarize(core: dict[str, Any], detection: dict[str, Any]) -> list[str]:
    """The core figures the table does not hold, one per line."""
    lines = []
    relaunch = core.get("relaunch", {})
    if relaunch:
        lines.append(
            f"SIGKILL main → relaunch spawned: median {relaunch['kill_to_new_pid_s']['median']} s; "
            f"→ serving again: median {relaunch['kill_to_serving_s']['median']} s (backoff 0)"
        )
    for key in ("release_attached", "release_detached"):
        if key in core:
            lines.append(
                f"tp-8 SIGKILL → GPUs verified free ({key[8:]}): median {core[key]['kill_to_verified_free_s']['median']} s"
            )
    fp = core.get("footprint")
    if fp:
        lines.append(
            f"daemon: RSS {fp['rss_mib']['median']} MiB, CPU {fp['cpu_percent']['mean']} % while serving"
        )
    rate = detection.get("probe_rate")
    if rate:
        lines.append(f"probe load: {rate['per_s']} requests/s to an idle server")
    return lines


def main(argv: list[str] | None = None) -> None:
    """Run every benchmark and print the one table, then the core figures."""
    args = parser(__doc__).parse_args(argv)
    flags = ["--quick"] if args.quick else []
    load_before = os.getloadavg()
    say("== bench_core")
    core = bench_core.main(flags)
    say("== bench_detection")
    detection = bench_detection.main(flags)
    say("== bench_baselines")
    baselines = bench_baselines.main(flags)
    say("== bench_false")
    false = bench_false.main(flags)
    say("== bench_footprint")
    footprint = bench_footprint.main(flags)
    rows = table.build(baselines, detection, false, footprint)
    lines = summarize(core, detection)
    load = f"load average before {load_before[0]:.1f}, after {os.getloadavg()[0]:.1f} (1 min)"
    write_result("summary", {"quick": args.quick, "rows": rows, "lines": lines, "load": load})
    print(
        "\n== every row of the fault table (seconds from the fault's start; ratio = best alternative / supervisor)"
    )
    print(table.render(rows))
    print(load)
    print("\n== core figures")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
