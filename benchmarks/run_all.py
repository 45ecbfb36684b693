"""`make bench`: the core, detection and baseline benchmarks in turn, then a one-screen summary.

Run: ``.venv/bin/python -m benchmarks.run_all [--quick]`` (`--quick` is passed to each benchmark). Each one also
writes `benchmarks/results/<name>.json`.
"""

from __future__ import annotations

from typing import Any

from benchmarks import bench_baselines, bench_core, bench_detection
from benchmarks.common import parser, say, write_result


def summarize(core: dict[str, Any], detection: dict[str, Any], baselines: dict[str, Any]) -> list[str]:
    """The headline figures, one per line."""
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
    for name, r in detection.get("scenarios", {}).items():
        if "incidents_total" in r:
            lines.append(f"detect {name}: zero-fault, {r['incidents_total']} incidents")
        else:
            lines.append(f"detect {name}: {r['detected']} detected, median {r['latency_s']['median']} s")
    rate = detection.get("probe_rate")
    if rate:
        lines.append(f"probe load: {rate['per_s']} requests/s to an idle server")
    for scenario, rows in baselines.get("results", {}).items():
        cells = []
        for tool, r in rows.items():
            det = r.get("detect_s")
            cells.append(f"{tool}={'-' if det is None else det}")
        lines.append(f"baselines {scenario}: detect s " + " ".join(cells))
    return lines


def main(argv: list[str] | None = None) -> None:
    """Run the three benchmarks and print the summary."""
    args = parser(__doc__).parse_args(argv)
    flags = ["--quick"] if args.quick else []
    say("== bench_core")
    core = bench_core.main(flags)
    say("== bench_detection")
    detection = bench_detection.main(flags)
    say("== bench_baselines")
    baselines = bench_baselines.main(flags)
    lines = summarize(core, detection, baselines)
    write_result("summary", {"quick": args.quick, "lines": lines})
    print("\n== summary")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
