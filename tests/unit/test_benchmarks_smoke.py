"""The benchmark modules import and accept `--quick`; nothing here runs a benchmark."""

from __future__ import annotations

import importlib

import pytest

from benchmarks import bench_baselines, bench_detection, bench_soak, table
from benchmarks.common import parser, summary

MODULES = [
    "benchmarks.run_all",
    "benchmarks.bench_core",
    "benchmarks.bench_detection",
    "benchmarks.bench_baselines",
    "benchmarks.bench_group",
    "benchmarks.bench_soak",
    "benchmarks.bench_false",
    "benchmarks.bench_footprint",
    "benchmarks.bench_real",
    "benchmarks.fidelity_diff",
]


@pytest.mark.parametrize("name", MODULES)
def test_module_imports_and_has_main(name: str) -> None:
    """Each benchmark module imports and exposes a main() entry point."""
    module = importlib.import_module(name)
    assert callable(module.main)


def test_common_parser_accepts_quick() -> None:
    """The shared parser turns --quick on and defaults it off."""
    assert parser("x").parse_args(["--quick"]).quick is True
    assert parser("x").parse_args([]).quick is False


def test_detection_parser_accepts_quick_and_only() -> None:
    """bench_detection takes --quick and a list of scenarios for --only."""
    args = bench_detection.build_parser().parse_args(["--quick", "--only", "runtime_cuda_oom_crash"])
    assert args.quick and args.only == ["runtime_cuda_oom_crash"]


def test_baselines_parser_accepts_quick_bound_and_only() -> None:
    """bench_baselines takes --quick, --bound and --only."""
    args = bench_baselines.build_parser().parse_args(["--quick", "--bound", "30", "--only", "healthy"])
    assert args.quick and args.bound == 30 and args.only == ["healthy"]


def test_soak_parser_takes_minutes_seed_and_quiet() -> None:
    """bench_soak defaults to 30 minutes; --minutes shortens it."""
    assert bench_soak.build_parser().parse_args([]).minutes == 30
    args = bench_soak.build_parser().parse_args(["--minutes", "5", "--seed", "3", "--quiet", "10"])
    assert (args.minutes, args.seed, args.quiet) == (5, 3, 10)


def test_summary_figures() -> None:
    """summary() gives n, median and p90, and None figures for no samples."""
    s = summary([3.0, 1.0, 2.0])
    assert (s["n"], s["median"], s["min"], s["max"]) == (3, 2.0, 1.0, 3.0)
    assert summary([])["median"] is None


def test_k8s_default_only_on_the_healthy_scenario() -> None:
    """The 1 s-timeout k8s model runs only where it is the point: the healthy server."""
    assert "k8s_default" in bench_baselines.tools_for("healthy")
    assert "k8s_default" not in bench_baselines.tools_for("runtime_cuda_oom_crash")


@pytest.mark.unit
def test_table_compares_the_supervisor_with_the_fastest_alternative() -> None:
    """A crash row is met when the supervisor is correct again no later than k8s and systemd; ratios say by how much."""
    crash = {
        "supervisor": {"correct_s": 2.0, "bound_s": 45},
        "k8s": {"correct_s": 3.0, "bound_s": 45},
        "systemd": {"correct_s": 4.0, "bound_s": 45},
    }
    wedge = {"supervisor": {"detect_s": 8.0, "bound_s": 45}, "k8s": {"detect_s": None, "bound_s": 45}}
    rows = table.build(
        {"results": {"runtime_cuda_oom_crash": crash, "overlap_tp_desync_hang": wedge}}, {}, {}, {}
    )
    assert rows[0][0].startswith("runtime_cuda_oom_crash") and rows[0][-2:] == ["1.5x", "yes"]
    assert rows[1][-2:] == [">6x", "yes"] and rows[1][table.HEAD.index("k8s")] == ">45"
    assert "supervisor" in table.render(rows).splitlines()[0]


@pytest.mark.unit
def test_table_marks_a_false_restart_and_a_slow_wedge_as_not_met() -> None:
    """Any incident in a zero-fault episode, or a wedge p90 over 12 s, is a row not met."""
    false = {"runs": [{"episode": "busy_64 + cpu_saturated", "incidents": 1, "load_1m_at_end": 9.0}]}
    detection = {"scenarios": {"overlap_tp_desync_hang": {"latency_s": {"n": 5, "median": 9.0, "p90": 13.0}}}}
    rows = table.build({}, detection, false, {})
    assert [r[-1] for r in rows] == ["NO", "NO"]
