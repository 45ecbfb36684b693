"""The whole monitored world of the monitoring tier (and of benchmarks/bench_prometheus.py): the installed
daemon on an `AlertingHost`, a real Prometheus scraping it and its servers with the packaged scrape example and
rules, a real Alertmanager routed as the installed runbook's example, and one receiver for the daemon's webhook and
Alertmanager's notifications.

`monitored_world(root)` starts it all (the packaged files from `sglang-supervisor files`), yields a `World`, and
stops everything it started. The Alertmanager config is the runbook's routing example with two changes: each
receiver delivers to the test's receiver (`/pager`, `/ticket`, resolved notifications included) and the grouping
waits are a second instead of minutes.
"""

from __future__ import annotations

import contextlib
import re
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.alert_causes import PAGER, TICKET, WEBHOOK, Causes
from tests.support.alerting_host import SLOW_START_S, AlertingHost
from tests.support.daemon import checked
from tests.support.http import http
from tests.support.prometheus import Alertmanager, Prometheus, accelerated_rules, scrape_config
from tests.support.receiver import Receiver
from tests.support.wait import wait_for
from tests.support.wheel import Installed, ensure_installed

SECTION = "## Prometheus and Alertmanager"
STATE_FS_SIZE = "64m"
SCRAPED_TWICE = 'count_over_time(up{job="sglang-supervisor"}[1h]) >= 2'


@dataclass
class World:
    """Everything the tier's tests look at."""

    installed: Installed
    bundle: Path  # `files monitoring DIR`
    runbook: Path  # the installed runbook (`files runbook`)
    rules: Path  # the rules Prometheus loads (the packaged ones, their for: shortened)
    host: AlertingHost
    prometheus: Prometheus
    alertmanager: Alertmanager
    receiver: Receiver
    causes: Causes
    started: float  # Unix time the daemon was started

    @property
    def instance(self) -> str:
        """The daemon's `instance` label: its scrape target."""
        return f"127.0.0.1:{self.host.http_port}"


def cli(installed: Installed, *args: str) -> str:
    """Run the installed `sglang-supervisor` outside the checkout; its stdout."""
    result = subprocess.run(
        [str(installed.bin / "sglang-supervisor"), *args],
        env=installed.env(),
        cwd="/",
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def runbook_yaml(runbook: Path) -> list[dict[str, Any]]:
    """The YAML blocks of the runbook's "Prometheus and Alertmanager" section, in order."""
    text = runbook.read_text()
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0].split("\n# ", 1)[0]
    return [yaml.safe_load(block) for block in re.findall(r"```yaml\n(.*?)```", section, flags=re.DOTALL)]


def routing_example(runbook: Path) -> dict[str, Any]:
    """The runbook's Alertmanager routing example (the YAML block with a `route`)."""
    return next(block for block in runbook_yaml(runbook) if "route" in block)


def alertmanager_config(example: dict[str, Any], receiver: Receiver) -> dict[str, Any]:
    """The routing example with its receivers delivering to `receiver` and the grouping waits shortened."""
    config: dict[str, Any] = yaml.safe_load(yaml.safe_dump(example))
    route = config["route"]
    route.update(group_wait="1s", group_interval="1s", repeat_interval="1h")
    paths = {route["routes"][0]["receiver"]: PAGER, route["receiver"]: TICKET}
    config["receivers"] = [
        {"name": name, "webhook_configs": [{"url": receiver.url(path), "send_resolved": True}]}
        for name, path in paths.items()
    ]
    return config


@contextlib.contextmanager
def state_fs(path: Path) -> Iterator[Path]:
    """A small tmpfs at `path` (the daemon's state_dir) that a test can fill; skips where mounting is refused."""
    path.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={STATE_FS_SIZE}", "tmpfs", str(path)],
        capture_output=True,
        timeout=30,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs for state_dir: {mounted.stderr.decode(errors='replace').strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=30, check=False)


def _metrics_answer(host: AlertingHost) -> bool:
    with contextlib.suppress(OSError):
        return http(host.url + "/metrics", timeout=2).status == 200
    return False


@contextlib.contextmanager
def monitored_world(
    root: Path, interval_s: float = 1.0, slow_start_s: float = SLOW_START_S
) -> Iterator[World]:
    """Start the world, inject every cause, yield it; stop all of it at the end (the daemon's invariants checked).

    `interval_s` is the scrape and evaluation interval; `slow_start_s` the load of the `slowstart` server, which
    must outlast SglangServerDown's shortened for: by a few intervals.
    """
    installed = ensure_installed()
    bundle = root / "monitoring"
    cli(installed, "files", "monitoring", str(bundle))
    runbook = Path(cli(installed, "files", "runbook").strip())
    rules = root / "alerts-accelerated.yaml"
    rules.write_text(accelerated_rules((bundle / "alerts.yaml").read_text()))
    host_root = root / "host"
    host_root.mkdir(parents=True, exist_ok=True)
    with state_fs(host_root / "state") as state, Receiver() as receiver:
        receiver.refuse(WEBHOOK)
        alertmanager = Alertmanager(root / "alertmanager")
        prometheus = Prometheus(root / "prometheus")
        host = AlertingHost(
            host_root, installed=installed, webhook_url=receiver.url(WEBHOOK), slow_start_s=slow_start_s
        )
        try:
            alertmanager.start(alertmanager_config(routing_example(runbook), receiver))
            with checked(host):
                started = time.time()
                host.start()
                wait_for(lambda: _metrics_answer(host), 60, "the daemon's /metrics")
                prometheus.start(
                    scrape_config(
                        bundle / "prometheus.yml",
                        interval_s=interval_s,
                        supervisor=[f"127.0.0.1:{host.http_port}"],
                        sglang=[f"127.0.0.1:{spec.port}" for spec in host.specs],
                        rules=rules,
                        alertmanager=alertmanager.address,
                    )
                )
                # Two scrapes before the faults: each counter has its 0 sample, as under a Prometheus that
                # has watched the host for a while (a cause present at launch is in place before that).
                wait_for(
                    lambda: prometheus.query(SCRAPED_TWICE),
                    60 + 2 * interval_s,
                    "Prometheus' second scrape of the daemon",
                )
                causes = Causes(host, prometheus, receiver, state, started)
                causes.start()
                yield World(
                    installed,
                    bundle,
                    runbook,
                    rules,
                    host,
                    prometheus,
                    alertmanager,
                    receiver,
                    causes,
                    started,
                )
        finally:
            prometheus.stop()
            alertmanager.stop()
