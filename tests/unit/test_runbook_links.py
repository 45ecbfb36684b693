"""`[alerts] runbook_url` is the one base of every alert's runbook link, from the config file to each sink's body."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from supervisor import packaged
from supervisor.alerts.dispatcher import AlertmanagerSink, AlertSink, PagerDutySink, SlackSink, WebhookSink
from supervisor.alerts.from_config import build_sinks
from supervisor.alerts.payloads import FIRING
from supervisor.config import ConfigError, load_config
from supervisor.records.incident import Incident
from tests.support.paths import REPO

INCIDENT = Incident(id="inc-1", server="main", fault="oom", detected_at=1_780_000_000.0, action="restart")
SECRETS = {
    "RUNBOOK_TEST_HOOK": "https://hooks.example/x",
    "RUNBOOK_TEST_HMAC": "k",
    "RUNBOOK_TEST_SLACK": "https://hooks.slack.example/T/B/x",
    "RUNBOOK_TEST_PD": "rk",
}
CONFIG = """
[supervisor]
gpu_backend = "none"
[[servers]]
name = "main"
command = ["python", "-m", "sglang.launch_server"]
args = ["--model-path", "Qwen/Qwen3-8B"]
gpus = [0]
[alerts]
{runbook}
[alerts.webhook]
url_env = "RUNBOOK_TEST_HOOK"
hmac_secret_env = "RUNBOOK_TEST_HMAC"
[alerts.slack]
url_env = "RUNBOOK_TEST_SLACK"
[alerts.pagerduty]
routing_key_env = "RUNBOOK_TEST_PD"
[alerts.alertmanager]
url = "http://127.0.0.1:9093"
"""


@pytest.fixture(autouse=True)
def secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    """The sinks' secrets, in the daemon's environment."""
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)


def sinks(tmp_path: Path, runbook: str = "") -> list[AlertSink]:
    """The sinks `run` builds from a config file with every sink and the given `[alerts]` line."""
    path = tmp_path / "sup.toml"
    path.write_text(CONFIG.format(runbook=runbook))
    return build_sinks(load_config(path, env=SECRETS).alerts)


def links(sink: AlertSink) -> list[str]:
    """The runbook links in the body a sink sends for a firing incident."""
    body: Any = json.loads(sink.request(INCIDENT, FIRING, now=1_780_000_010.0).body)
    if isinstance(sink, SlackSink):
        texts = [
            e["text"] for block in body["blocks"] if block["type"] == "context" for e in block["elements"]
        ]
        return [m for text in texts for m in re.findall(r"<([^|>]+)\|Runbook", text)]
    if isinstance(sink, PagerDutySink):
        return [link["href"] for link in body["links"]]
    if isinstance(sink, AlertmanagerSink):
        return [alert["annotations"]["runbook_url"] for alert in body]
    assert isinstance(sink, WebhookSink)
    return [body["runbook_url"]]


def test_a_configured_base_links_every_sink_to_the_fault_section(tmp_path: Path) -> None:
    """runbook_url = "https://…/runbook.md": Slack, PagerDuty, Alertmanager and the webhook link `<base>#oom`."""
    base = "https://git.example.com/ops/sglang-supervisor/blob/main/runbook.md"
    built = sinks(tmp_path, f'runbook_url = "{base}"')
    assert {type(s) for s in built} == {WebhookSink, SlackSink, PagerDutySink, AlertmanagerSink}
    for sink in built:
        assert links(sink) == [f"{base}#oom"], sink


def test_the_default_base_is_the_packaged_runbook_with_the_fault_anchor(tmp_path: Path) -> None:
    """Without runbook_url every sink links the installed runbook.md (a file:// URL) at the fault's own anchor."""
    for sink in sinks(tmp_path):
        (link,) = links(sink)
        assert link == f"{packaged.runbook_url()}#oom", sink
    path = Path(packaged.runbook_url().removeprefix("file://"))
    assert path.read_bytes() == (REPO / "runbook.md").read_bytes()
    assert '<a id="oom"></a>' in path.read_text()


@pytest.mark.parametrize(
    "value", ["runbook.md", "https://x.example/runbook.md#top", "ftp://x/runbook.md", ""]
)
def test_a_runbook_url_that_is_not_an_absolute_link_is_a_config_error(tmp_path: Path, value: str) -> None:
    """A relative path, a fragment or another scheme fails the config at alerts.runbook_url."""
    with pytest.raises(ConfigError, match=r"alerts\.runbook_url"):
        sinks(tmp_path, f'runbook_url = "{value}"')
