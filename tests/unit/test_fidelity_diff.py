"""The stable parts of the fidelity diff: log normalisation, metric shapes, profile differences."""

from __future__ import annotations

import pytest

from benchmarks.fidelity_diff import diff_profiles, metric_shapes, normalise

pytestmark = pytest.mark.unit

_EXPOSITION = """# HELP sglang:num_running_reqs The number of running requests.
sglang:num_running_reqs{engine_type="unified",model_name="m",tp_rank="0"} 1.0
sglang:realtime_tokens_total{mode="decode",model_name="m",tp_rank="0"} 317.0
sglang:e2e_request_latency_seconds_bucket{le="0.1",model_name="m"} 3.0
sglang:e2e_request_latency_seconds_sum{model_name="m"} 0.2
python_gc_objects_collected_total{generation="0"} 10.0
"""


def test_normalise_drops_timestamps_numbers_and_paths() -> None:
    """Two runs' lines compare equal once the timestamp, PIDs and paths are gone."""
    a = "[2026-12-01 01:11:20] Subprocess scheduler_0 (pid=4242) crashed with exit code -9. See /tmp/x/y.log"
    b = "[2026-12-02 11:00:01] Subprocess scheduler_0 (pid=17) crashed with exit code -15. See /var/a.log"
    assert normalise(a) == normalise(b)
    assert normalise(a).startswith("Subprocess scheduler_N (pid=N) crashed")


def test_metric_shapes_lists_sglang_names_with_label_sets() -> None:
    """Only `sglang:` metrics, histogram suffixes folded, label names sorted."""
    shapes = metric_shapes(_EXPOSITION)
    assert shapes == {
        "sglang:e2e_request_latency_seconds": ["le", "model_name"],
        "sglang:num_running_reqs": ["engine_type", "model_name", "tp_rank"],
        "sglang:realtime_tokens": ["mode", "model_name", "tp_rank"],
    }


def test_diff_of_a_profile_with_itself_is_empty() -> None:
    """No differences between identical profiles."""
    profile = {
        "titles": ["sglang::scheduler"],
        "endpoints": {"GET /health#0": 200},
        "metrics": metric_shapes(_EXPOSITION),
    }
    assert diff_profiles(profile, profile) == []


def test_diff_names_each_difference_by_its_path() -> None:
    """Set elements only on one side and changed values are reported with their dotted key."""
    real = {"titles": ["sglang::scheduler", "resource_tracker"], "endpoints": {"GET /v1/models#6": 200}}
    sim = {"titles": ["sglang::scheduler"], "endpoints": {"GET /v1/models#6": 404}, "extra": 1}
    assert diff_profiles(real, sim) == [
        "endpoints.GET /v1/models#6: real=200 sim=404",
        "extra: real=null sim=1",
        "titles: only real: resource_tracker",
    ]
