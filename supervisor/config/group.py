"""`[group]`: this host's seat in a multi-node group and how to reach etcd (docs/config.md).

The model is frozen and validated like the rest of the file; `check_group` adds the checks that span the
section and the member server's SGLang arguments (`--nnodes`, `--node-rank`, `--dist-init-addr`). It
returns (dotted path, value, what is allowed) triples that the config loader turns into its errors.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field
from pydantic import ValidationInfo as _Info

from supervisor.group.etcd import EtcdSettings
from supervisor.group.member import GroupParams

ETCD_MIN_TTL_S = 2  # etcd refuses shorter leases (1.5 election timeouts at its default tick)
_HOST_PORT = re.compile(r"^\[?[A-Za-z0-9_.:-]+\]?:\d{1,5}$")
_SECRET_MAX_BYTES = 64 * 1024


def _resolve(value: Path | None, info: _Info) -> Path | None:
    base = (info.context or {}).get("base_dir")
    if value is None or value.is_absolute() or base is None:
        return value
    return Path(base) / value


_File = Annotated[Path | None, BeforeValidator(lambda v: None if v == "" else v), AfterValidator(_resolve)]


class EtcdConfig(BaseModel):
    """`[group.etcd]`: endpoints, per-call timeout, TLS files and user (password in a file)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    endpoints: tuple[Annotated[str, Field(pattern=r"^https?://\S+$")], ...] = Field(min_length=1)
    timeout_s: float = Field(5, gt=0, le=60)
    ca_file: _File = None
    cert_file: _File = None
    key_file: _File = None
    username: str = ""
    password_file: _File = None

    def settings(self) -> EtcdSettings:
        """The client settings, with the password read from its file (never logged)."""
        password = ""
        if self.password_file is not None:
            with self.password_file.open("rb") as fh:
                password = fh.read(_SECRET_MAX_BYTES).decode().strip()
        return EtcdSettings(
            self.endpoints,
            self.timeout_s,
            self.ca_file,
            self.cert_file,
            self.key_file,
            self.username,
            password,
        )


class GroupConfig(BaseModel):
    """`[group]`: one server of this host is node `node_rank` of an `nnodes`-node group."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_-]{0,62}$")
    server: str
    node_rank: int = Field(ge=0)
    nnodes: int = Field(ge=2, le=256)
    lease_ttl_s: int = Field(10, ge=ETCD_MIN_TTL_S, le=300)
    barrier_timeout_s: float = Field(300, gt=0)
    etcd: EtcdConfig

    def params(self) -> GroupParams:
        """What the group member needs."""
        return GroupParams(self.name, self.node_rank, self.nnodes, self.lease_ttl_s, self.barrier_timeout_s)


Problem = tuple[str, object, str]


def check_group(
    group: GroupConfig,
    server_names: Sequence[str],
    arg: Callable[[str], str | None],
    canaries: tuple[str, float] = ("off", 0.0),
) -> list[Problem]:
    """Checks across `[group]`, its files and the member server's SGLang arguments (`arg` reads one).

    `canaries`: the member's (canary_mode, stream_canary_period_s); a node ≥ 1 serves no API to run them on.
    """
    problems: list[Problem] = []
    if group.server not in server_names:
        return [("group.server", group.server, f"the name of a [[servers]] entry: {list(server_names)}")]
    if group.node_rank >= group.nnodes:
        problems.append(("group.node_rank", group.node_rank, f"less than nnodes ({group.nnodes})"))
    at = f"servers[{list(server_names).index(group.server)}].args"
    for flag, want in (("--nnodes", group.nnodes), ("--node-rank", group.node_rank)):
        got = arg(flag)
        if got != str(want):
            problems.append((at, got, f"{flag} {want} (group.{flag[2:].replace('-', '_')})"))
    addr = arg("--dist-init-addr")
    if addr is None or not _HOST_PORT.match(addr) or not 0 < int(addr.rsplit(":", 1)[1]) < 65536:
        problems.append((at, addr, "--dist-init-addr HOST:PORT (node 0's address, the same on every node)"))
    if group.node_rank > 0 and canaries != ("off", 0):
        at_probes = at.removesuffix(".args") + ".probes"
        allowed = (
            "canary_mode = 'off' and stream_canary_period_s = 0: a node ≥ 1 answers only a dummy /health"
        )
        problems.append((at_probes, list(canaries), allowed))
    etcd = group.etcd
    for key in ("ca_file", "cert_file", "key_file", "password_file"):
        path = getattr(etcd, key)
        if path is not None and not path.is_file():
            problems.append((f"group.etcd.{key}", str(path), "an existing file (or '' for none)"))
    if (etcd.cert_file is None) != (etcd.key_file is None):
        problems.append(("group.etcd.key_file", str(etcd.key_file or ""), "cert_file and key_file together"))
    if bool(etcd.username) != (etcd.password_file is not None):
        problems.append(("group.etcd.password_file", None, "username and password_file together"))
    if group.barrier_timeout_s <= group.lease_ttl_s:
        allowed = f"more than lease_ttl_s ({group.lease_ttl_s} s): a lost node's lease expires within it"
        problems.append(("group.barrier_timeout_s", group.barrier_timeout_s, allowed))
    return problems
