"""The launch spec's hash is versioned: a change of the normal form is never read as a change of the spec."""

from __future__ import annotations

import pytest

from policies.spec import Found, adoption_refusal, spec_hash

pytestmark = pytest.mark.unit
ARGS = ("--model-path", "m", "--tp-size", "2")


def found(recorded: str, desired: str, args: tuple[str, ...] = ARGS) -> Found:
    return Found(None, recorded, desired, ARGS, args, (), (), None)


def test_the_same_spec_is_adopted() -> None:
    """Same argv, env and GPUs (in any order): the same hash, nothing refuses."""
    one = spec_hash(["python", *ARGS], {"A": "1", "B": "2"}, [1, 0])
    assert one == spec_hash(["python", *ARGS], {"B": "2", "A": "1"}, [0, 1]) and one.startswith("v1:")
    assert adoption_refusal(found(one, one)) is None


def test_an_env_change_refuses_and_an_added_flag_is_named() -> None:
    """A changed environment refuses by the hash; a changed argv names the flag."""
    one = spec_hash(["python", *ARGS], {}, [0])
    other = spec_hash(["python", *ARGS], {"NCCL_DEBUG": "INFO"}, [0])
    assert (
        adoption_refusal(found(one, other)) == "the launch spec differs from the config (environment or GPUs)"
    )
    added = adoption_refusal(found(one, one, (*ARGS, "--disable-cuda-graph")))
    assert added == "the launch spec differs from the config (+--disable-cuda-graph)"


def test_a_hash_of_another_normal_form_version_compares_the_argv_only() -> None:
    """An older daemon's `v0:` hash is not a change: the recorded argv decides."""
    now = spec_hash(["python", *ARGS], {}, [0])
    assert adoption_refusal(found("v0:abc", now)) is None
    assert adoption_refusal(found("v0:abc", now, (*ARGS, "--x"))) is not None
