"""The hardened unit as shipped: the server runs as `sglang`, everything is written under the unit's own
directories, and a collective hang's forensics hold a py-spy stack of every rank (ptrace under
NoNewPrivileges=)."""

from __future__ import annotations

import json

from tests.systemd.machine import DEVICES, LOGS, MODEL, SGLANG_URL, STATE, UNIT, Machine

# Where the unit lets the daemon and its servers write: ReadWritePaths=, the *Directory= settings, PrivateTmp=
# (the unit's own /tmp) and /dev/shm (NCCL and SGLang's queues).
WRITABLE = (
    "/var/lib/sglang-supervisor/",
    "/var/log/sglang-supervisor/",
    "/var/cache/sglang-supervisor/",
    "/run/sglang-supervisor/",
    "/tmp/systemd-private-",
    "/dev/shm/",
)
# The host's own trees, read-only to the unit (ProtectSystem=strict, ProtectHome=yes) and too large to walk in
# the overlay: /usr, the home directories and the checkout's file system.
SKIP = "\\( -path /proc -o -path /sys -o -path /usr -o -path /root -o -path /home -o -path /work \\) -prune"


def test_the_server_runs_as_sglang_and_holds_its_gpu_device_paths(machine: Machine) -> None:
    """The daemon, the SGLang main and every rank run as `sglang`; each rank holds its stand-in GPU open."""
    server = machine.wait_serving()
    users = {pid: user for pid, user, _ in machine.processes()}
    assert users[machine.main_pid()] == "sglang"
    assert users[server["pid"]] == "sglang"
    ranks = machine.ranks()
    assert len(ranks) == 2 and {user for _, user in ranks} == {"sglang"}, ranks
    assert set(machine.holders(DEVICES)) >= {pid for pid, _ in ranks}, "the ranks hold the GPU device paths"


def test_a_collective_hang_is_recovered_with_every_ranks_stack_in_forensics(machine: Machine) -> None:
    """overlap_tp_desync_hang under the unit: collective_hang from py-spy stacks, one file per rank in the bundle
    under StateDirectory=, the incident journaled there, SGLang's log under LogsDirectory=."""
    first = machine.wait_serving()
    answer = machine.post(SGLANG_URL + "/sim/fault", {"name": "overlap_tp_desync_hang", "after_requests": 1})
    assert "overlap_tp_desync_hang" in answer, answer
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "Hi."}], "max_tokens": 8}
    machine.sh(
        f"for i in 1 2 3; do curl -s -m 30 -o /dev/null -H 'Content-Type: application/json' "
        f"-d '{json.dumps(chat)}' {SGLANG_URL}/v1/chat/completions & done"
    )
    cured = machine.wait_server(
        lambda s: s["state"] == "serving" and s["pid"] != first["pid"], 120, "the hang recovered"
    )
    incident = cured["last_incident"]
    assert incident["fault"] == "collective_hang", incident
    stacks = incident["evidence"].get("stacks")
    assert stacks, f"decided without py-spy stacks: {incident['evidence']}"
    bundle = incident["forensics_path"]
    assert bundle.startswith(f"{STATE}/forensics/"), bundle
    for rank in ("TP0", "TP1"):
        dump = machine.sh(f"cat {bundle}/stack-sglang_scheduler_{rank}.txt")
        assert f"Process {stacks[f'sglang::scheduler_{rank}']['pid']}:" in dump and "Thread " in dump, dump[
            :500
        ]
    assert incident["id"] in {i["id"] for i in machine.incidents()}, (
        f"the incident is in {STATE}/incidents.jsonl"
    )
    assert "state.json" in machine.sh(f"ls {STATE}")
    assert "Uvicorn running" in machine.sh(f"cat {LOGS}/sim.log")
    assert machine.one_tree()


def test_nothing_is_written_outside_the_units_writable_paths(machine: Machine) -> None:
    """Every file and folder the `sglang` user owns (all the daemon and its servers created) lies under
    ReadWritePaths=, the unit's directories, its private /tmp or /dev/shm."""
    assert machine.prop("ProtectSystem") == "strict" and machine.prop("NoNewPrivileges") == "yes"
    found = machine.sh(f"find / {SKIP} -o -user sglang -print 2>/dev/null || true").split()
    assert any(path.startswith(STATE) for path in found), found[:20]
    outside = [path for path in found if not (path + "/").startswith(WRITABLE)]
    assert not outside, f"written outside the unit's writable paths: {outside[:20]}"
    private = machine.sh(f"ls -d /tmp/systemd-private-*-{UNIT}.service-* 2>/dev/null || true").split()
    assert len(private) == 1, f"the unit's PrivateTmp folder: {private}"
