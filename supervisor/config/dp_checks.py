"""check-config's note on a data-parallel server whose SGLang predates the one its per-rank signals were checked on.

Each DP rank is judged from its own `/v1/loads` snapshot as SGLang 0.5.23 writes it (docs/contracts.md, "Data
parallelism"). An older SGLang may lack the endpoint or the ranks' snapshot times: the supervisor then reads
nothing per rank and falls back to the whole-server lease, which finds one wedged rank only through a canary or a
`/health` that lands on it. The note says so before the first launch; it is never an error.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from policies.pd import Role
from supervisor.config.models import Config

CHECKED = (0, 5, 23)  # the SGLang release whose /v1/loads the per-rank rule was checked against


def _release(version: str) -> tuple[int, ...] | None:
    found = re.match(r"(\d+)\.(\d+)\.(\d+)", version)
    return tuple(int(g) for g in found.groups()) if found else None


def dp_notes(config: Config, version_of: Callable[[Sequence[str]], str | None]) -> list[str]:
    """One note per data-parallel server whose command runs an SGLang older than `CHECKED` (none when the version
    cannot be told)."""
    notes = []
    for i, server in enumerate(config.servers):
        if server.role is Role.ROUTER or server.dp_ranks <= 1:
            continue
        version = version_of(list(server.command))
        release = _release(version) if version else None
        if release is None or release >= CHECKED:
            continue
        notes.append(
            f"servers[{i}] ({server.name}): {server.dp_ranks} DP ranks on SGLang {version}: each DP rank is judged "
            "from its /v1/loads snapshot as SGLang 0.5.23 writes it; where this SGLang does not write one, the "
            "supervisor falls back to the whole-server lease (a wedged rank is then found only by a canary or a "
            "/health that lands on it)"
        )
    return notes
