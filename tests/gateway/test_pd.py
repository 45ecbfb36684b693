"""A PD pair behind SMG in PD mode: the prefill joins as a prefill with its bootstrap port, the decode as a
decode; a decode transfer wedge takes only the decode out (before its kill), the prefill keeps serving under the
same worker id, and the relaunched decode rejoins once proven."""

from __future__ import annotations

import json
from pathlib import Path

from tests.gateway.support import Clients, for_server, ts
from tests.support.daemon import PdDeployment, checked, q
from tests.support.gateways import ADMIN_KEY, running_gateway
from tests.support.http import http
from tests.support.wait import wait_for


def test_a_decode_wedge_takes_only_the_decode_out_of_smg_in_pd_mode(tmp_path: Path) -> None:
    """Clients through SMG (PD mode); `pd_decode_transfer_wedge` on the decode: decode out before its kill and
    back once proven; the prefill untouched (same PID, same worker id, never removed)."""
    (tmp_path / "gateway-key").write_text(ADMIN_KEY + "\n")
    with running_gateway("smg", tmp_path, extra=["--pd-disaggregation"]) as gw:
        lines = ["[gateway]", f"url = {q(gw.url)}", f"admin_key_file = {q(str(tmp_path / 'gateway-key'))}"]
        dep = PdDeployment(tmp_path, gateway_lines=lines, probes={"stream_canary_period_s": 0})
        with checked(dep):
            dep.start()
            urls = {
                "prefill": f"http://127.0.0.1:{dep.port}",
                "decode": f"http://127.0.0.1:{dep.decode_port}",
            }

            def both() -> dict[str, dict[str, object]]:
                listed = {w["url"]: w for w in gw.workers() if w.get("status") != "draining"}
                return listed if all(u in listed for u in urls.values()) else {}

            first = wait_for(both, 120, "prefill and decode in the gateway")
            assert first[urls["prefill"]]["worker_type"] == "prefill"
            assert first[urls["prefill"]]["bootstrap_port"] == dep.boot
            assert first[urls["decode"]]["worker_type"] == "decode"
            before = {n: dep.named(n)["pid"] for n in urls}
            with Clients(gw.url, n=2, model=dep.model) as clients:
                clients.wait_ok(5)
                wedge = {"name": "pd_decode_transfer_wedge", "after_requests": 1}
                assert http(urls["decode"] + "/sim/fault", "POST", wedge).status == 200
                dep.wait_all(
                    lambda s: s["decode"]["state"] == "serving" and s["decode"]["pid"] != before["decode"],
                    150,
                    "the decode relaunched",
                )
                again = wait_for(both, 60, "the decode back in the gateway")
            assert dep.named("prefill")["pid"] == before["prefill"]
            assert again[urls["prefill"]]["id"] == first[urls["prefill"]]["id"]
            assert dep.named("decode")["last_incident"]["fault"] == "pd_transfer_wedge"
            removed = dep_events(dep, "gateway.removed")
            assert {e["server"] for e in removed} == {"decode"}
            released = for_server(dep_events(dep, "recovery.release"), "decode")
            assert ts(removed[0]) < ts(released[0])
            assert clients.results, "requests went through the PD pair"


def dep_events(dep: PdDeployment, name: str) -> list[dict[str, object]]:
    """The daemon's log events called `name`."""
    found = []
    for line in (dep.root / "daemon.log").read_text(errors="replace").splitlines():
        if line.startswith("{") and f'"{name}"' in line:
            event = json.loads(line)
            if event.get("event") == name:
                found.append(event)
    return found
