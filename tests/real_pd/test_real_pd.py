"""The daemon supervising the real PD pair behind SMG in PD mode, shared by the tests of this module in file order:
each starts from both serving and leaves them serving again."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.real_pd.support import RealPdDeployment, both_serving, real_pd_deployment
from tests.real_serving.support import READY_S
from tests.support.gateways import post_chat
from tests.support.wait import wait_for


@pytest.fixture(scope="module")
def pd(tmp_path_factory: pytest.TempPathFactory, pd_python: Path, models: Path) -> Iterator[RealPdDeployment]:
    root = tmp_path_factory.mktemp("real-pd")
    with real_pd_deployment(root, pd_python, models) as dep:
        dep.start()
        yield dep


def in_gateway(dep: RealPdDeployment) -> bool:
    assert dep.gateway is not None
    live = dep.gateway.live()
    return all(url in live for url in dep.urls.values())


def test_the_pair_serves_proven_through_smg(pd: RealPdDeployment) -> None:
    """Both servers proven by a canary that fits the role, both in SMG, a chat through SMG answered."""
    servers = pd.wait_all(both_serving, READY_S, "prefill and decode serving")
    for name in ("prefill", "decode"):
        assert not servers[name].get("unproven"), servers[name]
    wait_for(lambda: in_gateway(pd), 120, "both in SMG")
    assert pd.gateway is not None
    assert post_chat(pd.gateway.url, str(pd.model_dir), stream=False, timeout_s=120) == "ok"
