"""`sglang-supervisor`: run, check-config, status, restart|pause|resume, rung, demo, drill, install-unit, files."""

from __future__ import annotations

import argparse
import asyncio
import getpass
import json
import os
import secrets
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from supervisor.config import Config

DEFAULT_URL = "http://127.0.0.1:9400"
EX_CONFIG = 78  # sysexits: the unit's RestartPreventExitStatus — restarting cannot fix a bad config


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sglang-supervisor", description="Supervise an SGLang deployment.")
    sub = p.add_subparsers(dest="cmd", required=True)
    run = sub.add_parser("run", help="run the daemon")
    run.add_argument("--config", required=True, type=Path)
    run.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    chk = sub.add_parser("check-config", help="validate a config file")
    chk.add_argument("--config", required=True, type=Path)
    chk.add_argument(
        "--manifest", type=Path, help="a Kubernetes manifest that runs this config: grace, probes"
    )
    chk.add_argument("--compose", type=Path, help="a Compose file that runs this config: grace, health, shm")
    hand = sub.add_parser("handover", help="restart the daemon in place, keeping every server (an upgrade)")
    hand.add_argument("--url", default=os.environ.get("SGLSUP_URL", DEFAULT_URL))
    hand.add_argument("--timeout", type=float, default=120.0, help="give up waiting after this many seconds")
    st = sub.add_parser("status", help="show the daemon's status")
    st.add_argument("--url", default=os.environ.get("SGLSUP_URL", DEFAULT_URL))
    st.add_argument("--json", action="store_true")
    st.add_argument("--watch", nargs="?", const=2.0, type=float, metavar="SECONDS")
    st.add_argument("--count", type=int, metavar="N", help="with --watch: stop after N screens")
    rung = sub.add_parser("rung", help="show a server's fallback rungs, or set or reset one (token needed)")
    rung.add_argument("action", choices=["show", "reset", "set"])
    rung.add_argument("--server", help="the server (show: all when omitted)")
    rung.add_argument(
        "--ladder", help="the ladder key, e.g. collective_hang (reset: every ladder when omitted)"
    )
    rung.add_argument("--level", type=int, help="set: the rung to launch with (0 = the configured flags)")
    rung.add_argument(
        "--restart", action="store_true", help="restart now (planned) instead of at the next launch"
    )
    rung.add_argument("--reason", default="")
    rung.add_argument("--url", default=os.environ.get("SGLSUP_URL", DEFAULT_URL))
    rung.add_argument("--token-file", type=Path, default=os.environ.get("SGLSUP_TOKEN_FILE"))
    for name in ("restart", "pause", "resume"):
        c = sub.add_parser(name, help=f"{name} a server (all when --server is omitted)")
        c.add_argument("--server")
        c.add_argument("--reason", default="")
        c.add_argument("--url", default=os.environ.get("SGLSUP_URL", DEFAULT_URL))
        c.add_argument("--token-file", type=Path, default=os.environ.get("SGLSUP_TOKEN_FILE"))
    _training_parsers(sub)
    from supervisor.importing import add_parser as add_import_parser

    add_import_parser(sub)
    _packaging_parsers(p, sub)
    return p


def _training_parsers(sub: Any) -> None:
    """`demo` and `drill`: the simulated deployment, its ports and its directory (supervisor/training/)."""
    from supervisor.training.scenarios import drill_lines

    keep = "keep the state, incident journal, forensics and logs, and print where they are"
    demo = sub.add_parser("demo", help="supervise a simulated 8-GPU SGLang server")
    demo.add_argument("--scenario", help="a simulator fault scenario (e.g. overlap_tp_desync_hang)")
    demo.add_argument("--print-config", action="store_true", help="print the config it would run and exit")
    demo.add_argument("--port", type=int, help="status port (default 9400, or a free one if it is busy)")
    demo.add_argument(
        "--sglang-port", type=int, help="simulated SGLang's port (default 30000, or a free one)"
    )
    demo.add_argument("--keep", action="store_true", help=keep)
    drill = sub.add_parser(
        "drill",
        help="on-call training: inject a fault into a simulated server and narrate",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="scenarios (name — the fault → what the supervisor is expected to do):\n  "
        + "\n  ".join(drill_lines()),
    )
    drill.add_argument("scenario", nargs="?", help="the scenario to drill (--list shows them)")
    drill.add_argument("--list", action="store_true", help="print one line per scenario and exit")
    drill.add_argument("--timeout", type=float, default=180.0, help="give up after this many seconds")
    drill.add_argument("--port", type=int, help="status port (default: a free one)")
    drill.add_argument("--sglang-port", type=int, help="simulated SGLang's port (default: a free one)")
    drill.add_argument("--keep", action="store_true", help=keep)
    drill.add_argument(
        "--lead-in", type=float, default=5.0, metavar="SECONDS", help="pause between serving and the fault"
    )


def _packaging_parsers(p: argparse.ArgumentParser, sub: Any) -> None:
    """`--version`, `install-unit` and `files`: the packaged files (supervisor/install.py)."""
    from supervisor import packaged

    force_help = "replace an edited file (the old one kept as .bak)"
    p.add_argument("--version", action="version", version=f"%(prog)s {packaged.version()}")
    unit = sub.add_parser("install-unit", help="install the systemd unit and its env file for this venv")
    unit.add_argument("--prefix", type=Path, default=Path("/"), help="install under this root (default /)")
    unit.add_argument("--dry-run", action="store_true", help="say what would be written; write nothing")
    unit.add_argument("--force", action="store_true", help=force_help)
    files = sub.add_parser("files", help="print where a packaged file is, or copy it into DIR")
    files.add_argument("kind", choices=sorted(packaged.KINDS))
    files.add_argument("dir", nargs="?", type=Path, help="copy the files into this directory")
    files.add_argument("--force", action="store_true", help=force_help)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the console script."""
    raw = list(sys.argv[1:] if argv is None else argv)
    after = raw.index("--") if raw[:1] == ["import"] and "--" in raw else len(raw)
    args = _parser().parse_args(raw[:after])
    if args.cmd == "import":
        from supervisor.importing.command import run_import

        return run_import(args.units, raw[after + 1 :], args.output, args.force, args.parsers)
    if args.cmd == "run":
        return cmd_run(args.config, args.log_level)
    if args.cmd == "check-config":
        return cmd_check(args.config, args.manifest, args.compose)
    if args.cmd == "handover":
        from supervisor.handover import cmd_handover

        return cmd_handover(args.url, args.timeout)
    if args.cmd == "status":
        return cmd_status(args.url, args.json, args.watch, args.count)
    if args.cmd in ("restart", "pause", "resume"):
        return cmd_control(args.cmd, args.url, args.server, args.reason, args.token_file)
    if args.cmd == "rung":
        return cmd_rung(args)
    if args.cmd == "drill":
        return cmd_drill(args)
    if args.cmd == "install-unit":
        from supervisor.install import install_unit

        return install_unit(args.prefix, dry_run=args.dry_run, force=args.force)
    if args.cmd == "files":
        from supervisor.install import copy_files

        return copy_files(args.kind, args.dir, force=args.force)
    return cmd_demo(args.scenario, args.print_config, args.port, args.sglang_port, args.keep)


def _invalid(path: Path, errors: str) -> int:
    """Every config error with its field path on stderr; EX_CONFIG, which systemd does not restart."""
    print(f"{path}: invalid configuration\n{errors}", file=sys.stderr)
    return EX_CONFIG


def cmd_check(path: Path, manifest: Path | None = None, compose: Path | None = None) -> int:
    """Exit 0 when `run` would start; otherwise every error with its field path, exit 78, no traceback.

    The config is loaded and built by the same code as `run` (`supervisor.config.prepare`), then each server's
    args and ladder flags are checked against its own SGLang's `--help`. The stop budget is printed; a
    `manifest` or `compose` file that runs the config is checked against it (warnings; exit 1 when unreadable).
    """
    from supervisor.config import ConfigError, load_config
    from supervisor.config.checks import parser_warnings
    from supervisor.config.compose import check_compose
    from supervisor.config.dp_checks import dp_notes
    from supervisor.config.manifest import ManifestError, check_manifest
    from supervisor.config.pd_checks import pd_warnings, router_warnings
    from supervisor.config.prepare import prepare
    from supervisor.config.stopbudget import advice, stop_budget
    from supervisor.gateway.check import gateway_warnings
    from supervisor.host.flaghelp import sglang_version
    from supervisor.redaction import secret_file_warnings

    try:
        cfg = load_config(path)
        prepare(cfg)
    except ConfigError as exc:
        return _invalid(path, exc.format_errors())
    budget, short = advice(stop_budget(cfg))
    try:
        pod = check_manifest(manifest, cfg) if manifest is not None else []
        pod += check_compose(compose, cfg) if compose is not None else []
    except ManifestError as exc:
        print(f"check-config: {exc}", file=sys.stderr)
        return 1
    found = [*secret_file_warnings(cfg), *parser_warnings(cfg), *pd_warnings(cfg, os.environ)]
    found += [*router_warnings(cfg), *dp_notes(cfg, sglang_version), *([budget] if short else []), *pod]
    for warning in [*found, *gateway_warnings(cfg)]:
        print(f"warning: {warning}", file=sys.stderr)
    problems = check_target_flags(cfg)
    if problems:
        print(f"{path}: the target rejects some flags", file=sys.stderr)
        print("\n".join(problems), file=sys.stderr)
        return EX_CONFIG
    print(f"{path}: ok ({len(cfg.servers)} server(s): {', '.join(s.name for s in cfg.servers)})")
    if not short:
        print(budget)
    return 0


def check_target_flags(cfg: Config) -> list[str]:
    """Launch args and ladder flags each server's own SGLang rejects (learned from its `--help`)."""
    from policies import argv
    from policies.flagcompat import check_ladders, rejected
    from policies.pd import Role
    from supervisor.host.flaghelp import HelpUnavailable, missing_transfer_module, target_flags

    state = Path(cfg.supervisor.state_dir) / "flagcache"
    cache = state if os.access(state.parent if state.parent.exists() else Path("/"), os.W_OK) else None
    cache = cache or Path(tempfile.gettempdir()) / "sglang-supervisor-flagcache"
    problems: list[str] = []
    for i, server in enumerate(cfg.servers):
        if server.role is Role.ROUTER:
            continue
        flags = target_flags(list(server.command), cache)
        if isinstance(flags, HelpUnavailable):
            print(f"servers[{i}] ({server.name}): flags not checked: {flags.reason}", file=sys.stderr)
            continue
        problems += [
            f"servers[{i}].args: {flag} is not accepted by {server.command[-1]}"
            for flag in rejected(server.args, flags)
        ]
        problems += [f"servers[{i}].policy.{line}" for line in check_ladders(server.ladders, flags)]
        if server.role in (Role.PREFILL, Role.DECODE):
            backend = argv.value(server.args, "--disaggregation-transfer-backend") or "mooncake"
            module = missing_transfer_module(list(server.command), backend)
            if module:
                problems.append(
                    f"servers[{i}].args: --disaggregation-transfer-backend {backend} needs the {module!r} module, "
                    f"which {server.command[0]} cannot import (SGLang exits at start)"
                )
    return problems


def cmd_run(path: Path, level: str) -> int:
    """Run the daemon until SIGTERM."""
    from supervisor.config import ConfigError, load_config
    from supervisor.daemon import Daemon
    from supervisor.host.gpu import GpuBackendUnavailable
    from supervisor.reporting.logsetup import configure

    if os.getpid() == 1:  # a container's entrypoint: a minimal init above the daemon (supervisor.pid1)
        from supervisor import pid1
        from supervisor.handover import daemon_argv

        return pid1.run(daemon_argv(path, level))
    configure(level)
    try:
        daemon = Daemon(load_config(path), path)
    except ConfigError as exc:
        return _invalid(path, exc.format_errors())
    except GpuBackendUnavailable as exc:
        print(f"GPU backend unavailable: {exc}", file=sys.stderr)
        return 1
    code = asyncio.run(daemon.run())
    if daemon.handing_over:
        from supervisor.handover import reexec

        reexec(path, level)  # does not return: the new daemon adopts every run
    return code


def cmd_status(url: str, as_json: bool, watch: float | None, count: int | None = None) -> int:
    """Print the status (a table for humans, or the JSON), once or `--watch`ed (supervisor/reporting/status_text)."""
    from supervisor.reporting.status_text import show

    return show(url, as_json, watch, count)


def render_status(body: dict[str, Any]) -> str:
    """One screen of the `/status` document."""
    from supervisor.reporting.status_text import render_status as render

    return render(body)


def cmd_rung(args: argparse.Namespace) -> int:
    """`rung show` reads /status; `rung set|reset` posts /control/rung with the token (supervisor/rungs.py)."""
    if args.action == "show":
        from supervisor.reporting.status_text import fetch
        from supervisor.rungs import show_lines

        try:
            servers = [s for s in fetch(args.url)["servers"] if args.server in (None, s["name"])]
        except (OSError, ValueError, KeyError) as exc:
            print(f"cannot reach the supervisor at {args.url}: {exc}", file=sys.stderr)
            return 2
        if not servers:
            print(f"unknown server {args.server!r}", file=sys.stderr)
            return 1
        print("\n".join(line for s in servers for line in show_lines(s)))
        return 0
    body = {"action": args.action, "server": args.server, "ladder": args.ladder, "level": args.level}
    return _post_control(
        "rung", args.url, {**body, "restart": args.restart, "reason": args.reason}, args.token_file
    )


def cmd_control(action: str, url: str, server: str | None, reason: str, token_file: Path | None) -> int:
    """POST /control/<action> with the bearer token."""
    return _post_control(action, url, {"server": server, "reason": reason}, token_file)


def _post_control(action: str, url: str, fields: dict[str, Any], token_file: Path | None) -> int:
    """POST /control/<action> with `fields`, the caller's user name and the bearer token; the answer printed."""
    if token_file is None:
        print("a token is needed: --token-file FILE (or SGLSUP_TOKEN_FILE)", file=sys.stderr)
        return 2
    try:
        token = Path(token_file).read_text().strip()
    except OSError as exc:
        print(f"cannot read {token_file}: {exc.strerror}", file=sys.stderr)
        return 2
    body = json.dumps({**fields, "actor": getpass.getuser()}).encode()
    req = urllib.request.Request(
        url.rstrip("/") + f"/control/{action}",
        data=body,
        method="POST",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            print(resp.read(65536).decode())
            return 0
    except urllib.error.HTTPError as exc:
        print(f"{exc.code}: {exc.read(65536).decode(errors='replace')}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"cannot reach the supervisor at {url}: {exc}", file=sys.stderr)
        return 2


def cmd_demo(
    scenario: str | None,
    print_config: bool,
    port: int | None,
    sglang_port: int | None = None,
    keep: bool = False,
) -> int:
    """Write a simulator config in a temp dir and run the daemon on it; Ctrl-C stops everything."""
    from supervisor.config import load_config
    from supervisor.daemon import Daemon
    from supervisor.reporting.logsetup import configure
    from supervisor.training.demo import PortBusy, demo_config, pick_sglang_port, pick_status_port, workdir

    try:
        ports = pick_status_port(port), pick_sglang_port(sglang_port)
    except PortBusy as exc:
        print(f"demo: {exc}", file=sys.stderr)
        return 2
    with workdir("sglsup-demo-", keep and not print_config) as root:
        text = demo_config(root, scenario, *ports)
        if print_config:
            print(text)
            return 0
        (root / "control.token").write_text(secrets.token_urlsafe(24) + "\n")
        (root / "control.token").chmod(0o600)
        path = root / "demo.toml"
        path.write_text(text)
        configure("info")
        daemon = Daemon(load_config(path), path)
        print(
            f"sglang-supervisor demo: status at {daemon.status.url}/status  (Ctrl-C stops everything)",
            flush=True,
        )
        print(f"  sglang-supervisor status --watch --url {daemon.status.url}", flush=True)
        print(f"  simulated SGLang: http://127.0.0.1:{ports[1]}", flush=True)
        print(f"  control token: {root / 'control.token'}", flush=True)
        if keep:
            print(f"  kept after exit: {root} (state/, log/, demo.toml)", flush=True)
        return asyncio.run(daemon.run())


def cmd_drill(args: argparse.Namespace) -> int:
    """`drill --list`, or one drill (supervisor/training/drill.py)."""
    from supervisor.training.scenarios import drill_lines

    if args.list or args.scenario is None:
        print("\n".join(drill_lines()), file=sys.stdout if args.list else sys.stderr)
        return 0 if args.list else 2
    from supervisor.training.drill import run_drill

    return run_drill(
        args.scenario,
        args.timeout,
        port=args.port,
        sglang_port=args.sglang_port,
        keep=args.keep,
        lead_in_s=args.lead_in,
    )


if __name__ == "__main__":
    sys.exit(main())
