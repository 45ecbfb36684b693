"""The operator's files the distribution carries, and its version.

The systemd unit and its env file, the monitoring bundle (alert rules, their promtool tests, the Grafana
dashboard), the runbook, the config reference and the example configs live at the top of the repository;
`supervisor/_share/` links to them, and the wheel and the sdist carry them there as package data
(pyproject.toml). This module is the one place that finds them, in a checkout and in an installed venv alike.
"""

from __future__ import annotations

from importlib import metadata, resources
from pathlib import Path

DISTRIBUTION = "sglang-supervisor"
# `sglang-supervisor files KIND`: what each kind is under supervisor/_share/.
KINDS = {
    "unit": "systemd",
    "monitoring": "monitoring",
    "examples": "examples",
    "runbook": "runbook.md",
    "config-reference": "config.md",
}
UNIT_NAME = "sglang-supervisor.service"
ENV_NAME = "sglang-supervisor.env"


def share() -> Path:
    """The directory of the packaged files."""
    return Path(str(resources.files("supervisor") / "_share"))


def path(kind: str) -> Path:
    """The packaged file or directory of `kind` (one of KINDS), as a real path."""
    return (share() / KINDS[kind]).resolve()


def files(kind: str) -> list[Path]:
    """The files of `kind`, sorted: the directory's regular files, or the one file."""
    where = path(kind)
    if where.is_dir():
        return sorted(p for p in where.iterdir() if p.is_file())
    return [where]


def version() -> str:
    """The installed distribution's version ("unknown" when it is not installed, e.g. a bare checkout)."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "unknown"


def runbook_url() -> str:
    """The packaged runbook as a `file://` URL: the default base of the alerts' runbook links."""
    return path("runbook").as_uri()
