"""`systemctl reload`: a good config applies (a probe setting, and a new alert sink that then gets the next
incident's alert); a bad one fails the reload with the field path in the journal and changes nothing; the
server keeps serving through both."""

from __future__ import annotations

import json

from tests.support.wait import wait_for
from tests.systemd.machine import CONFIG, FILES, UNIT, Machine

SINK_PORT = 9911
SINK_FILE = "/run/alert-sink.jsonl"
URL_FILE = "/etc/sglang-supervisor/webhook.url"


def configured(machine: Machine) -> str:
    return machine.sh(f"cat {CONFIG}")


def test_a_good_config_is_applied_without_touching_the_server(machine: Machine) -> None:
    """A changed probe period and a new webhook sink: the reload succeeds, `config.reloaded` names both, the
    server keeps its PID, and the sink receives the alert of the next incident (a rank killed)."""
    first = machine.wait_serving()
    machine.sh(
        f"systemd-run --unit=alert-sink --property=Type=exec /usr/bin/python3 {FILES}/sink.py {SINK_PORT} {SINK_FILE}"
    )
    machine.put(URL_FILE, f"http://127.0.0.1:{SINK_PORT}/alerts\n", mode="0640")
    text = configured(machine).replace("health_period_s = 1\n", "health_period_s = 2\n")
    machine.put(CONFIG, text + f'\n[alerts.webhook]\nurl_file = "{URL_FILE}"\n')
    cursor = machine.cursor()
    reload = machine.systemctl("reload", UNIT)
    assert reload.returncode == 0, reload.stdout + reload.stderr
    reloaded = wait_for(lambda: machine.events(cursor, "config.reloaded"), 30, "config.reloaded")
    assert {"alerts", "servers[0]"} <= set(reloaded[-1]["changed"]), reloaded
    assert machine.prop("ActiveState") == "active"
    assert machine.wait_serving()["pid"] == first["pid"], "a reload never restarts the server"

    rank = machine.ranks()[0][0]
    machine.sh(f"kill -KILL {rank}")
    cured = machine.wait_server(
        lambda s: s["state"] == "serving" and s["pid"] != first["pid"], 90, "relaunched"
    )
    incident = cured["last_incident"]["id"]

    def delivered() -> list[dict[str, object]]:
        lines = machine.sh(f"cat {SINK_FILE} 2>/dev/null || true").splitlines()
        return [alert for alert in map(json.loads, lines) if incident in json.dumps(alert)]

    assert wait_for(delivered, 30, "the incident's alert at the new sink")


def test_a_bad_config_fails_the_reload_and_changes_nothing(machine: Machine) -> None:
    """An invalid probe period: `systemctl reload` fails, the journal names the field, the daemon (same PID)
    keeps its config and its server; fixed, the next reload applies."""
    first = machine.wait_serving()
    good = configured(machine)
    pid = machine.main_pid()
    machine.put(CONFIG, good.replace("health_period_s = 2\n", "health_period_s = -1\n"))
    cursor = machine.cursor()
    reload = machine.systemctl("reload", UNIT)
    assert reload.returncode != 0, "the reload of an invalid config must fail"
    messages = machine.messages(cursor)
    assert any("servers[0].probes.health_period_s" in m for m in messages), messages
    assert any("Reload failed" in m for m in messages), messages
    assert not machine.events(cursor, "config.reloaded"), "nothing applied"
    assert (machine.prop("ActiveState"), machine.main_pid()) == ("active", pid)
    assert machine.wait_serving()["pid"] == first["pid"]
    machine.put(CONFIG, good)
    assert machine.systemctl("reload", UNIT).returncode == 0
