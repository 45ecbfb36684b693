"""A launch's identity: the normal form of what was launched, versioned, and whether a found run may be adopted.
Pure.

The hash covers the argv, the environment the server was given and its GPUs, in a normal form that carries its
version (`SPEC_VERSION`): a hash made by another version of this normal form is never read as "the spec
changed" (the kubelet restarted whole nodes when its container hash drifted between releases) — the recorded
argv is compared instead.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from policies.ladders import diff_args

SPEC_VERSION = 1


def spec_hash(argv: Sequence[str], env: Mapping[str, str], gpus: Sequence[int]) -> str:
    """`v<version>:<sha256>` of the launch's normal form."""
    form = {"argv": list(argv), "env": sorted(env.items()), "gpus": sorted(gpus)}
    digest = hashlib.sha256(json.dumps(form, sort_keys=True).encode()).hexdigest()
    return f"v{SPEC_VERSION}:{digest}"


@dataclass(frozen=True)
class Found:
    """What the daemon found of a previous daemon's run, and what it wants to launch now."""

    identity_problem: str | None  # None: the same process still runs (boot id, pid, start time, marker)
    recorded_spec: str
    desired_spec: str
    recorded_args: tuple[str, ...]  # SGLang args as launched (secrets masked)
    desired_args: tuple[str, ...]  # SGLang args the config launches now (secrets masked the same way)
    missing_ranks: tuple[str, ...]
    foreign_holders: tuple[str, ...]  # holders of the server's GPUs that are not of the run
    server_info_problem: str | None  # /server_info disagrees with the config (model, tp), None when it agrees


def adoption_refusal(found: Found) -> str | None:
    """Why the found run cannot be adopted (it is reaped and relaunched), or None: adopt it."""
    if found.identity_problem:
        return found.identity_problem
    if found.missing_ranks:
        return f"a partial tree: {', '.join(found.missing_ranks)} gone"
    if found.foreign_holders:
        return f"GPUs held by processes that are not of the run: {'; '.join(found.foreign_holders)}"
    same_version = found.recorded_spec.split(":", 1)[0] == found.desired_spec.split(":", 1)[0]
    spec_changed = same_version and found.recorded_spec != found.desired_spec
    if spec_changed or found.recorded_args != found.desired_args:
        changes = diff_args(found.recorded_args, found.desired_args).lines()
        what = "; ".join(changes) if changes else "environment or GPUs"
        return f"the launch spec differs from the config ({what})"
    if found.server_info_problem:
        return found.server_info_problem
    return None
