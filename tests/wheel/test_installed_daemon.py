"""The installed daemon (no checkout, no dev venv on any path): the demo serves, a collective hang is decided with stacks."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from tests.support import procs
from tests.support.daemon import Deployment, Traffic
from tests.support.paths import REPO
from tests.support.ports import free_port
from tests.support.wait import wait_for
from tests.support.wheel import Installed

STATUS_LINE = re.compile(r"status at (http://\S+)/status")


def get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return bytes(resp.read())


def state(url: str) -> str | None:
    """The first server's state in /status (None while the daemon does not answer)."""
    with contextlib.suppress(OSError, ValueError, IndexError, KeyError):
        return str(json.loads(get(url + "/status"))["servers"][0]["state"])
    return None


@dataclass
class InstalledDeployment(Deployment):
    """A simulated deployment whose daemon and simulator are the installed ones, run outside the checkout."""

    installed: Installed | None = None
    cwd: Path | None = None  # where the daemon is started (its root by default)

    def write(self) -> None:
        super().write()
        assert self.installed is not None
        text = self.config_path.read_text()
        self.config_path.write_text(
            text.replace(json.dumps(sys.executable), json.dumps(str(self.installed.python)))
        )

    def start(self) -> subprocess.Popen[bytes]:
        assert self.installed is not None
        with open(self.root / "daemon.log", "ab") as log:
            self.daemon = subprocess.Popen(
                [str(self.installed.bin / "sglang-supervisor"), "run", "--config", str(self.config_path)],
                cwd=self.cwd or self.root,
                env=self.installed.env(),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return self.daemon


def test_installed_demo_serves_and_reports_its_version(installed: Installed, tmp_path: Path) -> None:
    """`sglang-supervisor demo` from the venv reaches serving; /status and build_info carry the wheel's version."""
    out = tmp_path / "demo.out"
    env = {**installed.env(), "TMPDIR": str(tmp_path)}
    with out.open("wb") as sink:
        demo = subprocess.Popen(
            [str(installed.bin / "sglang-supervisor"), "demo", "--port", str(free_port())],
            cwd=tmp_path,
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    sim: Path | None = None
    try:
        found = wait_for(lambda: STATUS_LINE.search(out.read_text()), 60, "the demo's status URL")
        url = found.group(1)
        sim = next(tmp_path.glob("sglsup-demo-*")) / "sim"
        wait_for(lambda: state(url) == "serving", 90, "the demo serving")
        status = json.loads(get(url + "/status"))
        assert status["version"] == installed.version
        metrics = get(url + "/metrics").decode()
        build_info = next(
            line for line in metrics.splitlines() if line.startswith("sglang_supervisor_build_info{")
        )
        assert f'version="{installed.version}"' in build_info, build_info
        main = status["servers"][0]["pid"]
        assert procs.title(psutil.Process(main)).startswith(str(installed.python))
        demo.send_signal(signal.SIGINT)
        assert demo.wait(timeout=120) == 0, out.read_text()[-3000:]
        assert not procs.ours(sim), "the demo left processes behind"
    finally:
        if demo.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(demo.pid, signal.SIGKILL)
            demo.wait(timeout=10)
        if sim is not None:
            procs.kill_all(sim)


def test_installed_daemon_decides_a_collective_hang_from_py_spy_stacks(
    installed: Installed, tmp_path: Path
) -> None:
    """overlap_tp_desync_hang under the installed daemon: collective_hang from py-spy stacks, one per rank in forensics."""
    scenario = tmp_path / "scenario.toml"
    scenario.write_text(
        '[[fault]]\nname = "overlap_tp_desync_hang"\nafter_requests = 6\nrecur_until_flag = "--disable-overlap-schedule"\n'
    )
    dep = InstalledDeployment(
        tmp_path, env={"SGLANG_SIM_SCENARIO": str(scenario)}, probes={"stall_after_s": 4}, installed=installed
    )
    try:
        dep.start()
        first = dep.wait(lambda s: s["state"] == "serving", what="serving")
        assert procs.title(psutil.Process(first["pid"])).startswith(str(installed.python))
        with Traffic(dep.sim_url, dep.model):
            cured = dep.wait(
                lambda s: s["state"] == "serving" and s["pid"] != first["pid"], timeout=120, what="relaunched"
            )
        incident: dict[str, Any] = cured["last_incident"]
        assert incident["fault"] == "collective_hang", incident
        stacks = incident["evidence"].get("stacks")
        assert stacks, f"decided without py-spy stacks: {incident['evidence']}"
        ranks = [stacks[f"sglang::scheduler_TP{i}"] for i in range(2)]
        assert {rank["collective"] for rank in ranks} == {"broadcast", "all_reduce"}, stacks
        bundle = Path(incident["forensics_path"])
        for rank in ("TP0", "TP1"):
            dump = (bundle / f"stack-sglang_scheduler_{rank}.txt").read_text()
            assert f"Process {stacks[f'sglang::scheduler_{rank}']['pid']}:" in dump and "Thread " in dump, (
                dump[:500]
            )
        assert "--disable-overlap-schedule" in cured["argv"]
    finally:
        dep.cleanup()


def test_handover_reexecutes_the_installed_program_whatever_the_working_directory_holds(
    installed: Installed, tmp_path: Path
) -> None:
    """A daemon started in a directory holding a checkout of this project (another version of its code) hands
    over to exactly the installed program: /status keeps the wheel's version, the server is adopted."""
    checkout = tmp_path / "checkout"
    shutil.copytree(
        REPO / "supervisor", checkout / "supervisor", ignore=shutil.ignore_patterns("__pycache__")
    )
    packaged = checkout / "supervisor" / "packaged.py"
    packaged.write_text(packaged.read_text() + '\n\ndef version() -> str:\n    return "the-checkout"\n')
    (tmp_path / "dep").mkdir()
    dep = InstalledDeployment(tmp_path / "dep", installed=installed, cwd=checkout)
    try:
        dep.start()
        first = dep.wait(lambda s: s["state"] == "serving", what="serving")
        before = dep.status()
        assert before["version"] == installed.version
        handover = subprocess.run(
            [str(installed.bin / "sglang-supervisor"), "handover", "--url", dep.url],
            cwd=checkout, env=installed.env(), capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert handover.returncode == 0, handover.stdout + handover.stderr + dep.log_tail()
        after = dep.status()
        assert (after["pid"], after["version"]) == (before["pid"], installed.version)
        assert after["started_at"] != before["started_at"]
        assert after["servers"][0]["pid"] == first["pid"] and after["servers"][0]["adopted"]["handover"]
    finally:
        dep.cleanup()
