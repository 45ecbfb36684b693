"""Which ladder a fault takes: the cause its evidence names first, the argv's hints only without one."""

from __future__ import annotations

from typing import Any

import pytest

from policies.diagnose import DiagnoseContext, diagnose
from policies.ladders import DEFAULT_LADDERS
from policies.model import Fault, Observation, ProbeSettings
from policies.plan import build_argv
from policies.triage import PlanFacts, plan, tags

pytestmark = pytest.mark.unit
NOW = 1000.0
SPEC_ARGS = ("--model-path", "m", "--tp-size", "2", "--speculative-algorithm", "EAGLE3")


class _Restart:
    restarts, window_s, initial_s, factor, max_s, jitter = 5, 600.0, 5.0, 2.0, 300.0, 0.0
    stable_after_s, slow_retry_s, immediate_first = 600.0, 1800.0, True


def _obs(probe: str, **values: Any) -> Observation:
    return Observation(probe, NOW, True, probe, 0.01, values)


def _stall() -> Observation:
    return _obs("progress", stalled_s=25.0, work_reasons=["generation_requests_active"], pd_stalled_s=0.0)


def _fault(window: list[Observation], kind: str = "collective_hang") -> Fault:
    fault = diagnose(window, DiagnoseContext("serving", "unified", 0.0, ProbeSettings()), NOW)
    assert fault is not None and fault.kind == kind
    return fault


def _relaunch_argv(fault: Fault, args: tuple[str, ...]) -> tuple[str | None, tuple[str, ...]]:
    facts = PlanFacts(
        role="unified", args=args, restarts=(), serving_since=None, restart=_Restart(), jitter=0.0,
        history=(), levels={}, ladders=DEFAULT_LADDERS, parser_policy="fix",
    )  # fmt: skip
    chosen = plan(fault, facts, NOW).plan
    assert chosen.action == "relaunch"
    return chosen.ladder_key, build_argv(args, chosen.levels, DEFAULT_LADDERS)[0]


def test_tp_desync_on_a_spec_decode_server_keeps_spec_decoding_and_disables_overlap() -> None:
    """Ranks in different collectives (a TP desync) get --disable-overlap-schedule; EAGLE-3 stays."""
    frames = {"TP0": {"collective": "broadcast"}, "TP1": {"collective": "all_reduce"}}
    stacks = _obs("stacks", ranks=frames, diverging=True, all_in=None)
    key, argv = _relaunch_argv(_fault([_stall(), stacks]), SPEC_ARGS)
    assert key == "collective_hang"
    assert argv == (*SPEC_ARGS, "--disable-overlap-schedule")


def test_a_tp_desync_names_its_cause_in_the_evidence() -> None:
    """The diagnosis tags ranks blocked in different collectives `tp_desync`."""
    frames = {"TP0": {"collective": "broadcast"}, "TP1": {"collective": "all_reduce"}}
    stacks = _obs("stacks", ranks=frames, diverging=True, all_in=None)
    assert _fault([_stall(), stacks]).evidence["tags"] == ["tp_desync"]


def test_spinning_gpus_on_a_spec_decode_server_drop_speculative_decoding() -> None:
    """Evidence that names no cause (GPUs spinning): the argv's spec_decode picks the variant."""
    gpu = _obs("gpu", spin=[0, 1], xids=[])
    fault = _fault([_stall(), gpu])
    assert tags(fault, SPEC_ARGS) == ["spec_decode"]
    key, argv = _relaunch_argv(fault, SPEC_ARGS)
    assert key == "collective_hang:spec_decode"
    assert "--speculative-algorithm" not in argv


def test_an_evidence_cause_wins_over_the_argv_hint() -> None:
    """An illegal memory access on a speculative-decoding server takes the illegal_memory_access ladder."""
    line = "CUDA error: an illegal memory access was encountered"
    hits = [{"name": "ima", "kind": "crash", "tag": "illegal_memory_access", "line": line}]
    assert tags(_fault([_obs("logs", hits=hits)], "crash"), SPEC_ARGS) == ["illegal_memory_access"]
