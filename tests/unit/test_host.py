"""supervisor/host without live processes: rank titles, the shm ownership filter, GPU backend parsing and errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.host import cleanup, gpu
from supervisor.host.gpu import GpuBackendUnavailable
from supervisor.host.proctree import expected_rank_titles


def test_expected_rank_titles_follow_sglang_prefixes() -> None:
    """Titles are sglang::scheduler for tp=1, _TP/_DP_TP/_PP_TP otherwise, plus detokenizer and DP controller."""
    assert expected_rank_titles(1) == ["sglang::scheduler", "sglang::detokenizer"]
    assert expected_rank_titles(2)[:2] == ["sglang::scheduler_TP0", "sglang::scheduler_TP1"]
    dp = expected_rank_titles(2, dp=2)
    assert dp[:4] == [f"sglang::scheduler_DP{d}_TP{t}" for d in (0, 1) for t in (0, 1)]
    assert dp[4:] == ["sglang::detokenizer", "sglang::data_parallel_controller"]
    assert expected_rank_titles(1, pp=2)[:2] == ["sglang::scheduler_PP0", "sglang::scheduler_PP1"]
    assert expected_rank_titles(2, pp=2)[1] == "sglang::scheduler_PP0_TP1"


def test_with_dp_attention_the_dp_ranks_split_the_tp_group() -> None:
    """`--tp-size 4 --dp-size 2 --enable-dp-attention`: four schedulers, TP ranks 0-1 attention-DP rank 0 and 2-3
    rank 1 (SGLang titles each with its attention-DP rank and its global TP rank), not eight."""
    titles = expected_rank_titles(4, dp=2, dp_attention=True)
    assert titles[:4] == [f"sglang::scheduler_DP{t // 2}_TP{t}" for t in range(4)]
    assert titles[4:] == ["sglang::detokenizer", "sglang::data_parallel_controller"]
    assert expected_rank_titles(2, dp=2, dp_attention=True)[:2] == [
        "sglang::scheduler_DP0_TP0",
        "sglang::scheduler_DP1_TP1",
    ]


def test_sweep_shm_respects_the_ownership_filter(tmp_path: Path) -> None:
    """Only files the predicate attributes to the dead run are removed."""
    (tmp_path / "psm_mine").write_bytes(b"x")
    (tmp_path / "psm_theirs").write_bytes(b"x")
    removed = cleanup.sweep_shm(tmp_path, owned_by_dead_run=lambda p: p.name.endswith("mine"))
    assert [p.name for p in removed] == ["psm_mine"]
    assert (tmp_path / "psm_theirs").exists()


def test_parse_fuser_output_strips_access_letters() -> None:
    """fuser's stdout PIDs are parsed with their access letters removed."""
    assert gpu.parse_fuser_output("  123  456m 789c\n") == {123, 456, 789}
    assert gpu.parse_fuser_output("") == set()


def test_sim_backend_unreadable_state_is_a_reason(tmp_path: Path) -> None:
    """A corrupt nvml.json makes verify_free not ok, naming the file."""
    (tmp_path / "nvml.json").write_text("{not json")
    result = gpu.verify_free([0], [], gpu.open_backend("sim", tmp_path), 500.0, deadline_s=0.1)
    assert not result.ok and "nvml.json" in result.reason


def test_unknown_backend_names_the_allowed_ones() -> None:
    """An unknown backend name raises GpuBackendUnavailable listing nvml, sim, none."""
    with pytest.raises(GpuBackendUnavailable, match="nvml, sim, none"):
        gpu.open_backend("cuda")
