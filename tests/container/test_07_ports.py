"""The status port reached from the host: published with `-p 127.0.0.1:PORT:9400` where the engine can publish
without a bridge, and on the host network otherwise.

Podman publishes through slirp4netns (user-mode networking: a process on the host listens on the port and
forwards it into the container; no bridge, no firewall rule). Docker publishes only from its bridge network
(iptables rules or its userland proxy towards `docker0`), which these tests must not create: the host network is
docker's way here, and the README says so.
"""

from __future__ import annotations

import os
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.container.engines import Engine
from tests.container.running import STATUS_PORT, Box, config
from tests.support.ports import free_port
from tests.support.wait import wait_for

SLIRP = "slirp4netns:port_handler=slirp4netns"


def answers(url: str) -> int:
    """The HTTP status of GET `url` from the host (0 when nothing answers)."""
    try:
        with urllib.request.urlopen(url, timeout=4) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError:
        return 0


def serves_on_the_hosts_loopback(box: Box, port: int) -> None:
    """`/healthz` and then `/ready` answer 200 at 127.0.0.1:`port` of the host."""
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: answers(base + "/healthz") == 200, 60, "/healthz from the host", interval=0.3)
        wait_for(lambda: answers(base + "/ready") == 200, 90, "/ready from the host", interval=0.3)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{box.logs()[-3000:]}") from None


def test_the_status_port_published_with_p_answers_on_the_hosts_loopback(
    engine: Engine, tmp_path: Path
) -> None:
    """`run -p 127.0.0.1:PORT:9400` (podman, slirp4netns): `/healthz` and `/ready` of the supervisor inside
    answer on the host's loopback, and nothing else of the host's network changed."""
    if engine.name == "docker":
        pytest.skip("docker publishes ports only from its bridge network (iptables or its userland proxy), "
                    "which these tests must not create; docker is reached on the host network instead")  # fmt: skip
    port = free_port()
    box = Box.run(engine, tmp_path, f"sglsup-published-{os.getpid()}", ["--network", SLIRP,
                  "-p", f"127.0.0.1:{port}:{STATUS_PORT}"])  # fmt: skip
    try:
        serves_on_the_hosts_loopback(box, port)
    finally:
        box("rm", "-f", check=False)


def test_on_the_host_network_the_status_port_answers_on_the_hosts_loopback(
    engine: Engine, tmp_path: Path
) -> None:
    """`run --network host` with the config's status port bound to 127.0.0.1 (the secure default): `/healthz` and
    `/ready` answer on the host's loopback at that port."""
    port, sim = free_port(), free_port(4)
    text = config(host="127.0.0.1", port=port, sim_port=sim)
    box = Box.run(engine, tmp_path, f"sglsup-hostnet-{os.getpid()}", ["--network", "host"], text)
    try:
        serves_on_the_hosts_loopback(box, port)
    finally:
        box("rm", "-f", check=False)
