"""The group alerts of monitoring/alerts.yaml from a real partition: a real Prometheus scrapes both daemons of a
2-node group with the packaged scrape example and rules (their `for:` shortened as in the monitoring tier)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.etcd.support import EtcdServer, GroupDeployment, ThreadedProxy
from tests.support.paths import REPO
from tests.support.ports import free_port
from tests.support.prometheus import Prometheus, accelerated_rules, scrape_config
from tests.support.wait import wait_for

pytestmark = pytest.mark.etcd

READY_S = 120.0
ALERT_S = (
    60.0  # the partition noticed (lease TTL 2 s, etcd timeout 2 s), the for: of 2 minutes as 4 s, scrapes
)
BARRIER_TIMEOUT_S = 3.0


@pytest.fixture
def watched(
    tmp_path: Path, etcd: EtcdServer
) -> Iterator[tuple[GroupDeployment, GroupDeployment, ThreadedProxy, Prometheus]]:
    """Both daemons serving (node 1 behind a cuttable proxy to etcd), and Prometheus scraping them."""
    proxy = ThreadedProxy(etcd.client_port)
    addr = f"127.0.0.1:{free_port()}"
    nodes = []
    for rank, url in ((0, etcd.url), (1, proxy.url)):
        root = tmp_path / f"node{rank}"
        root.mkdir()
        nodes.append(
            GroupDeployment(
                root, rank=rank, etcd_url=url, dist_addr=addr, barrier_timeout_s=BARRIER_TIMEOUT_S
            )
        )
    rules = tmp_path / "alerts.yaml"
    rules.write_text(accelerated_rules((REPO / "monitoring" / "alerts.yaml").read_text()))
    prometheus = Prometheus(tmp_path / "prometheus")
    try:
        for n in nodes:
            n.start()
        for n in nodes:
            n.wait(lambda s: s["state"] == "serving", READY_S, "each node serving")
        prometheus.start(
            scrape_config(
                REPO / "monitoring" / "prometheus.yml",
                interval_s=1,
                supervisor=[f"127.0.0.1:{n.http_port}" for n in nodes],
                sglang=[f"127.0.0.1:{n.port}" for n in nodes],
                rules=rules,
                alertmanager=None,
            )
        )
        wait_for(
            lambda: len(prometheus.query('up{job="sglang-supervisor"} == 1')) == 2,
            READY_S,
            "both daemons scraped",
        )
        yield nodes[0], nodes[1], proxy, prometheus
    finally:
        prometheus.stop()
        for n in nodes:
            n.cleanup()
        proxy.close()


def firing(prometheus: Prometheus, alert: str, node: GroupDeployment) -> bool:
    """Whether `alert` fires for group g on `node`'s daemon."""
    return any(
        a["labels"]["alertname"] == alert
        and a["state"] == "firing"
        and a["labels"].get("instance") == f"127.0.0.1:{node.http_port}"
        and a["labels"].get("group") == "g"
        for a in prometheus.alerts()
    )


def test_a_partition_fires_etcd_unreachable_and_stuck_in_barrier_which_resolve_once_healed(
    watched: tuple[GroupDeployment, GroupDeployment, ThreadedProxy, Prometheus],
) -> None:
    """Node 1 cut off from etcd: SglangGroupEtcdUnreachable fires for node 1 and SglangGroupStuckInBarrier for
    node 0, which released and waits past its barrier timeout; healed, the group serves again and both resolve."""
    n0, n1, proxy, prometheus = watched
    before = n0.group()["generation"]  # a launch slowed by a loaded host may already have taken a second one
    cut = time.time()
    proxy.cut()
    expected = (("SglangGroupEtcdUnreachable", n1), ("SglangGroupStuckInBarrier", n0))
    for alert, node in expected:
        wait_for(lambda a=alert, n=node: firing(prometheus, a, n), ALERT_S, f"{alert} on node {node.rank}")
    proxy.heal()
    for n in (n0, n1):
        n.wait(lambda s: s["state"] == "serving", READY_S, "each node serving again")
    for alert, node in expected:
        wait_for(lambda a=alert, n=node: not firing(prometheus, a, n), ALERT_S, f"{alert} resolved")
        labels = {"instance": f"127.0.0.1:{node.http_port}", "group": "g"}
        spans = prometheus.firing_spans(alert, labels, cut - 1)
        assert spans and spans[0][0] >= cut - 1, (alert, spans)
    after = n0.group()["generation"]
    assert after == n1.group()["generation"] and after > before, (before, after)
