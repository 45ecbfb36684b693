"""The one table of `make bench`: every row of the fault table, the alternatives beside the supervisor, ratios.

Built from the result dicts of the benchmarks (pure: nothing here runs anything). Times are seconds from the
fault's start; `ratio` is the best alternative's figure ÷ the supervisor's (above 1: the supervisor is faster),
`>N` when no alternative got there within the bound. `target` is the figure the supervisor must meet.
"""

from __future__ import annotations

from typing import Any

TOOLS = ("supervisor", "k8s", "systemd", "sglang_watchdog", "script")
HEAD = ("row", "target", *TOOLS, "ratio", "met")
CRASHES = ("runtime_cuda_oom_crash", "orphans_hold_gpu_and_ports", "zombie_after_cpp_abort")
WEDGES = ("overlap_tp_desync_hang", "watchdog_disabled_silent_wedge", "custom_allreduce_spin_sigterm_immune")
LEAK = "tool_markup_leak_under_load"
ZERO = ("health_false_negative_long_prefill", "healthy")


def _cell(value: float | None, bound: float | None) -> str:
    if value is None:
        return f">{bound:.0f}" if bound else "never"
    return f"{value:.1f}"


def _ratio(sup: float | None, others: list[float | None], bound: float | None) -> str:
    got = [o for o in others if o is not None]
    if sup is None or sup <= 0:
        return "-"
    if not got:
        return f">{(bound or 0) / sup:.0f}x" if bound else "-"
    return f"{min(got) / sup:.1f}x"


def _timed(rows: dict[str, Any], key: str, name: str, target: str, rivals: tuple[str, ...]) -> list[str]:
    """One row of a per-tool time (`detect_s` or `correct_s`) from bench_baselines."""
    bound = max((float(r.get("bound_s") or 0) for r in rows.values()), default=0.0) or None
    values = {t: (rows.get(t) or {}).get(key) for t in TOOLS}
    cells = [
        "-" if t not in rows else ("error" if "error" in rows[t] else _cell(values[t], bound)) for t in TOOLS
    ]
    sup = values["supervisor"]
    ratio = _ratio(sup, [values[t] for t in rivals if t in rows], bound)
    best = [v for t in rivals if t in rows and (v := values[t]) is not None]
    if key == "correct_s" and rivals:
        met = sup is not None and (not best or sup <= min(best))
    else:
        limit = float(target.split("≤", 1)[1].split()[0]) if "≤" in target else None
        met = sup is not None and (limit is None or sup <= limit)
    return [name, target, *cells, ratio, "yes" if met else "NO"]


def baseline_rows(baselines: dict[str, Any]) -> list[list[str]]:
    """Crashes (correct again vs k8s/systemd), wedges, leak, parser, zero-fault rows of bench_baselines."""
    results = baselines.get("results", {})
    out: list[list[str]] = []
    for name in CRASHES:
        if name in results:
            out.append(
                _timed(
                    results[name], "correct_s", f"{name}: correct again", "≤ k8s, systemd", ("k8s", "systemd")
                )
            )
    for name in WEDGES:
        if name in results:
            out.append(_timed(results[name], "detect_s", f"{name}: first action", "≤ 12 s", TOOLS[1:]))
    if LEAK in results:
        out.append(_timed(results[LEAK], "detect_s", f"{LEAK}: found", "≤ 60 s", TOOLS[1:]))
    if "parser_misconfig" in results:
        out.append(
            _timed(results["parser_misconfig"], "correct_s", "parser_misconfig: correct again", "", TOOLS[1:])
        )
    for name in ZERO:
        rows = results.get(name)
        if rows:
            cells = [
                "-"
                if t not in rows
                else ("error" if "error" in rows[t] else f"{rows[t].get('n_actions', 0)} acts")
                for t in TOOLS
            ]
            sup = rows.get("supervisor", {})
            met = "error" not in sup and not sup.get("n_actions")
            out.append([f"{name}: false actions", "0", *cells, "", "yes" if met else "NO"])
    return out


def detection_rows(detection: dict[str, Any]) -> list[list[str]]:
    """First action p50 / p90 over the repeated runs of bench_detection (the supervisor only)."""
    out = []
    for name in (*WEDGES, "pd_decode_transfer_wedge"):
        r = detection.get("scenarios", {}).get(name)
        if not r or "latency_s" not in r:
            continue
        lat = r["latency_s"]
        p50, p90 = lat.get("median"), lat.get("p90")
        met = p50 is not None and p90 is not None and p50 <= 10 and p90 <= 12
        cell = f"{p50} / {p90} (n {lat.get('n')})"
        out.append([f"{name}: p50 / p90", "≤ 10 / ≤ 12 s", cell, *[""] * 4, "", "yes" if met else "NO"])
    return out


def false_rows(false: dict[str, Any]) -> list[list[str]]:
    """Incidents in the zero-fault episodes of bench_false (the supervisor only)."""
    out = []
    for r in false.get("runs", []):
        if "error" in r:
            out.append([f"{r['episode']}: incidents", "0", "error", *[""] * 4, "", "NO"])
            continue
        cell = f"{r['incidents']} (load {r['load_1m_at_end']})"
        out.append(
            [f"{r['episode']}: incidents", "0", cell, *[""] * 4, "", "yes" if not r["incidents"] else "NO"]
        )
    return out


def footprint_rows(footprint: dict[str, Any]) -> list[list[str]]:
    """Daemon CPU, RSS and loop lag of bench_footprint (the supervisor only)."""
    out = []
    for key, name, cpu_max, extra in (
        ("tp8", "daemon, one tp-8 server", 1.0, "≤ 60 MiB"),
        ("eight_tp1", "daemon, eight tp-1", 3.0, "lag p99 ≤ 0.1 s"),
    ):
        r = footprint.get(key)
        if not r or "error" in r:
            continue
        cpu, rss, lag = r["cpu_percent"]["mean"], r["rss_mib"]["median"], r["loop_lag_s"].get("p99")
        met = cpu <= cpu_max and (rss <= 60 if key == "tp8" else lag is not None and lag <= 0.1)
        cell = f"CPU {cpu} %, RSS {rss} MiB, lag p99 {lag} s"
        out.append([name, f"≤ {cpu_max:g} % CPU, {extra}", cell, *[""] * 4, "", "yes" if met else "NO"])
    return out


def render(rows: list[list[str]]) -> str:
    """Rows as an aligned text table, the header first."""
    table = [list(HEAD), *rows]
    widths = [max(len(r[i]) for r in table) for i in range(len(HEAD))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in table)


def build(
    baselines: dict[str, Any],
    detection: dict[str, Any],
    false: dict[str, Any],
    footprint: dict[str, Any],
) -> list[list[str]]:
    """Every row, in the order of the fault table."""
    return [
        *baseline_rows(baselines),
        *detection_rows(detection),
        *false_rows(false),
        *footprint_rows(footprint),
    ]
