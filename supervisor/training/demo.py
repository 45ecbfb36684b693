"""`sglang-supervisor demo`: the daemon supervising a simulated 8-GPU SGLang server, in a temp dir."""

from __future__ import annotations

import contextlib
import shutil
import socket
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

DEMO_MODEL = "moonshotai/Kimi-K2.5"
STATUS_PORT = 9400
SGLANG_PORT = 30000
RPC_OFFSET = 2  # the simulated rank 0 also binds its HTTP port + 2


class PortBusy(OSError):
    """A port asked for on the command line cannot be bound."""


def free_port(preferred: int = 0) -> int:
    """`preferred` if it can be bound on loopback, else any free port."""
    for port in (preferred, 0):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return int(sock.getsockname()[1])
    raise OSError("no free port on 127.0.0.1")


def pick_status_port(requested: int | None, preferred: int = STATUS_PORT) -> int:
    """The status port: `requested` (PortBusy when it is taken), else `preferred` if free, else any free one."""
    if requested is None:
        return free_port(preferred)
    if requested and free_port(requested) != requested:
        raise PortBusy(f"status port {requested} is in use on 127.0.0.1")
    return requested


def pick_sglang_port(requested: int | None, preferred: int | None = SGLANG_PORT) -> int:
    """The simulated SGLang's port P, whose P + 2 (its rank 0) must be free too: `requested` (PortBusy when
    either is taken), else `preferred` when both are free, else any free pair."""
    if requested is not None:
        if not _pair_free(requested):
            raise PortBusy(f"SGLang port {requested} or {requested + RPC_OFFSET} (its rank 0) is in use")
        return requested
    if preferred is not None and _pair_free(preferred):
        return preferred
    for _ in range(50):
        port = free_port(0)
        if _pair_free(port):
            return port
    raise OSError("no free port pair on 127.0.0.1")


def _pair_free(port: int) -> bool:
    high = port + RPC_OFFSET
    return port > 0 and high < 65536 and free_port(port) == port and free_port(high) == high


@contextlib.contextmanager
def workdir(prefix: str, keep: bool) -> Iterator[Path]:
    """A new temporary directory for a demo or drill; removed afterwards unless `keep`."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield path
    finally:
        if not keep:
            shutil.rmtree(path, ignore_errors=True)


def _toml_list(items: list[str]) -> str:
    return "[" + ", ".join(_q(i) for i in items) + "]"


def _q(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def demo_config(
    root: Path, scenario: str | None = None, http_port: int = STATUS_PORT, sglang_port: int = SGLANG_PORT
) -> str:
    """The TOML of a simulator deployment under `root` (a starting point for a real config)."""
    sim = root / "sim"
    gpus = list(range(8))
    env = {
        "SGLANG_SIM_STATE_DIR": str(sim),
        "SGLANG_SIM_SHM_DIR": str(sim / "shm"),
        "SGLANG_SIM_CONTROL": "1",
        "SGLANG_SIM_STARTUP_S": "1.5",
    }
    if scenario:
        env["SGLANG_SIM_SCENARIO"] = scenario
    args = [
        "--model-path", DEMO_MODEL, "--tp-size", "8", "--tool-call-parser", "kimi_k2", "--reasoning-parser",
        "kimi_k2", "--enable-metrics", "--host", "127.0.0.1", "--port", str(sglang_port),
    ]  # fmt: skip
    env_lines = "\n".join(f"{k} = {_q(v)}" for k, v in env.items())
    devices = [str(sim / "dev" / f"nvidia{g}") for g in gpus]
    return f"""# sglang-supervisor demo: a simulated 8-GPU Kimi-K2.5 server (see docs/config.md for every field).
[supervisor]
state_dir = {_q(str(root / "state"))}
log_dir = {_q(str(root / "log"))}
shm_dir = {_q(str(sim / "shm"))}
gpu_backend = "sim"
sim_state_dir = {_q(str(sim))}

[supervisor.http]
host = "127.0.0.1"
port = {http_port}
token_file = {_q(str(root / "control.token"))}

[supervisor.restart]
initial_s = 1
max_s = 30

[[servers]]
name = "kimi"
role = "unified"
command = {_toml_list([sys.executable, "-m", "simulator.launch_server"])}
args = {_toml_list(args)}
gpus = {gpus}
gpu_device_paths = {_toml_list(devices)}
ports = [{sglang_port + RPC_OFFSET}]
startup_budget_s = 600
startup_silence_s = 60
drain_grace_s = 15

[servers.env]
{env_lines}

[servers.probes]
canary_period_s = 120
"""
