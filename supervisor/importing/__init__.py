"""`sglang-supervisor import`: from the unit file or command line that starts SGLang today to a config.

`words` and `unitfile` read systemd's syntax, `source` gives the argv and environment a unit (or a command line)
starts a server with (`shell` unwraps a `bash -c` wrapper; `container` reads a `docker|podman|nerdctl run` and
`incontainer` takes the SGLang command inside it), `launchers` knows SGLang's commands, `infer` and
`deployment` turn them into servers, `suggest` moves a container's server under a supervisor in its image,
`render` writes the TOML and the summary, `command` is the CLI.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def add_parser(sub: Any) -> None:
    """The `import` subcommand's arguments (the command after `--` is split off before parsing)."""
    imp = sub.add_parser(
        "import",
        usage="sglang-supervisor import [-o FILE] [--force] [--parsers add|keep] (UNIT_FILE… | -- COMMAND…)",
        help="write a config from the unit files (or the command line) that start SGLang today",
        description="import UNIT_FILE… (one server each; a PD prefill, decode and router together) or "
        "import -- COMMAND…: a commented config on stdout, what was inferred and what to check on stderr. "
        "A docker, podman or nerdctl run gives the SGLang command inside the container, for the supervisor "
        "in the same image (the suggested run is on stderr).",
    )
    imp.add_argument(
        "units",
        nargs="*",
        type=Path,
        metavar="UNIT_FILE",
        help="a service unit (its drop-ins UNIT.d/*.conf too); - reads one, or pasted ExecStart= lines, from stdin",
    )
    imp.add_argument("-o", "--output", type=Path, help="write the config to this file instead of stdout")
    imp.add_argument("--force", action="store_true", help="replace an existing --output file")
    imp.add_argument(
        "--parsers",
        choices=("add", "keep"),
        default="add",
        help="add: set the model family's parsers in args (default); keep: leave the args' own, and warn",
    )
