"""`sglang-supervisor import`: unit files or a command line → a config on stdout (or `-o FILE`), a summary on stderr.

Exit 0 when the config validates as `check-config` loads it (the programs and flags of this host are checked by
`check-config` itself), 1 when it does not yet (it is still written, with every error in the summary), when an
input cannot be read or its server cannot be inferred (a container whose command is not SGLang's: nothing is
written), or when `-o FILE` exists and `--force` is not given; 2 for no input at all.
"""

from __future__ import annotations

import os
import sys
import tomllib
from pathlib import Path
from typing import TextIO

from policies.secrets import argv_secrets, env_secrets, scrub
from supervisor.config import ConfigError, parse_config
from supervisor.host.preflight import command_problem
from supervisor.importing.deployment import plan_deployment
from supervisor.importing.infer import ServerPlan
from supervisor.importing.render import render_config, render_summary
from supervisor.importing.source import ImportProblem, Source, from_command, from_unit


def run_import(
    units: list[Path],
    command: list[str] | None,
    output: Path | None,
    force: bool = False,
    parsers: str = "add",
    out: TextIO = sys.stdout,
    err: TextIO = sys.stderr,
    stdin: TextIO = sys.stdin,
) -> int:
    """Import `units` (one server each; `-` is read from `stdin`) and `command` (one more) into one config."""
    if not units and not command:
        print("import: give UNIT_FILE… or -- COMMAND…", file=err)
        return 2
    if output is not None and output.exists() and not force:
        print(f"import: {output} exists; --force replaces it", file=err)
        return 1
    try:
        sources: list[Source] = [from_unit(path, stdin) for path in units]
        if command:
            sources.append(from_command(command))
        plans = plan_deployment(sources, parsers)
    except ImportProblem as exc:
        print(f"import: {exc}", file=err)
        return 1
    text = render_config(plans)
    problems = _validate(text, output, plans)
    for plan, line in problems:
        plan.check.append(line)
    secrets = [s for p in plans for s in (*env_secrets(p.env), *argv_secrets(p.args))]
    if output is None:
        out.write(text)
        out.flush()
    else:
        try:
            _write(output, text, private=bool(secrets))
        except OSError as exc:
            print(f"import: cannot write {output}: {exc.strerror or exc}", file=err)
            return 1
    summary = render_summary(plans, str(output) if output else None)
    err.write(scrub(summary, secrets))
    return 1 if any(line.startswith("config:") for _, line in problems) else 0


def _validate(text: str, output: Path | None, plans: list[ServerPlan]) -> list[tuple[ServerPlan, str]]:
    """The config's errors as `check-config` loads it (`config: …`), and each command this host cannot run."""
    found: list[tuple[ServerPlan, str]] = []
    base = output.parent if output else Path.cwd()
    try:
        config = parse_config(tomllib.loads(text), base, {})
    except ConfigError as exc:
        return [(plans[0], f"config: {line}") for line in exc.format_errors().splitlines()]
    for plan, server in zip(plans, config.servers, strict=True):
        if plan.container is not None:
            continue  # it runs inside the image: check-config there checks it
        why = command_problem(server.command, server.env)
        if why:
            found.append((plan, f"command: {why} on this host (check-config refuses it)"))
    return found


def _write(path: Path, text: str, private: bool) -> None:
    """Write the config (its directory made if missing); readable by its owner only when it holds secrets."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.import")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)
    tmp.chmod(0o600 if private else 0o644)
    os.replace(tmp, path)
