"""Security review: no secret leaves the daemon; argv is never a shell string; names cannot escape directories."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest

from supervisor.config import ConfigError, ServerConfig, load_config
from supervisor.host.launcher import Launched, spawn
from tests.support.daemon import deployment
from tests.support.sim import launched_sim
from tests.support.wait import wait_for as poll

pytestmark = pytest.mark.hardening

ROOT = Path(__file__).resolve().parents[2]
KEY, ADMIN, ENV_SECRET = "sk-live-KEY-0123456789", "sk-admin-KEY-9876543210", "hf_ENVSECRET_42424242"


class _Capture(BaseHTTPRequestHandler):
    bodies: ClassVar[list[bytes]] = []

    def do_POST(self) -> None:
        self.bodies.append(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        return


@pytest.fixture
def alert_sink() -> Iterator[tuple[str, list[bytes]]]:
    """An Alertmanager stand-in on loopback that keeps every body it receives."""
    bodies: ClassVar[list[bytes]] = []
    handler = type("Capture", (_Capture,), {"bodies": bodies})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", bodies
    finally:
        server.shutdown()
        server.server_close()


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return str(resp.read().decode())


def test_no_secret_in_status_incidents_logs_state_forensics_or_alerts(
    tmp_path: Path, alert_sink: tuple[str, list[bytes]]
) -> None:
    """A server with --api-key, --admin-api-key and a token in its env serves (the probes present the key), then
    crashes: no copy of any secret anywhere."""
    url, bodies = alert_sink
    with deployment(
        tmp_path,
        extra_args=["--api-key", KEY, f"--admin-api-key={ADMIN}"],
        env={"HF_TOKEN": ENV_SECRET},
        alertmanager_url=url,
    ) as dep:
        dep.start()
        first = dep.wait(lambda s: s["state"] == "serving", 90, "serving: the canaries presented the key")
        os.kill(int(first["pid"]), 9)
        dep.wait(
            lambda s: bool(s.get("last_incident")) and s.get("pid") not in (None, first["pid"]),
            60,
            "relaunch",
        )
        poll(lambda: bool(bodies), 30, "an alert delivered")
        shown = [_get(dep.url + "/status"), _get(dep.url + "/incidents"), dep.log_tail(100000)]
        shown += [b.decode(errors="replace") for b in bodies]
        files = [p for p in (tmp_path / "state").rglob("*") if p.is_file()]
        assert any("forensics" in p.parts for p in files), files
        shown += [p.read_text(errors="replace") for p in files]
        for secret in (KEY, ADMIN, ENV_SECRET):
            leaks = [
                text[max(0, text.find(secret) - 80) : text.find(secret) + 40]
                for text in shown
                if secret in text
            ]
            assert not leaks, leaks
        assert "--api-key" in shown[0] and "***" in shown[0], "the flag stays visible, its value masked"


WEIRD = '/models/my model\'s "best"; rm -rf / $(touch PWNED) `id` |&>'


def test_argv_reaches_the_server_intact_never_through_a_shell(tmp_path: Path) -> None:
    """A model path with spaces, quotes, `;`, `$()` and backquotes reaches the server byte for byte, unexpanded."""
    with launched_sim(tmp_path, "--model-path", WEIRD, "--tool-call-parser", "qwen25") as sim:
        info = sim.get("/model_info").json()
        assert info["model_path"] == WEIRD
    marker = tmp_path / "PWNED"
    launched = spawn(
        [sys.executable, "-c", "import sys; print(repr(sys.argv[1:]))", WEIRD, f"$(touch {marker})"],
        {},
        [],
        "run-x",
        "x",
        tmp_path / "log" / "x.log",
    )
    assert isinstance(launched, Launched)
    poll(lambda: launched.returncode() is not None and bool(launched.tail(1)), 30, "the child's output")
    launched.close()
    assert launched.tail(1) == [repr([WEIRD, f"$(touch {marker})"])]
    assert not marker.exists()


HOSTILE_NAMES = ["../escape", "a/b", "..", ".hidden", "A", "", "x" * 64, "name with space", "a\x00b", "-flag"]


@pytest.mark.parametrize("name", HOSTILE_NAMES)
def test_a_server_name_that_could_escape_a_directory_is_refused(tmp_path: Path, name: str) -> None:
    """Names are `[a-z0-9][a-z0-9_-]{0,62}`: nothing with `/`, `..`, a leading dot or dash, NUL or spaces loads."""
    path = tmp_path / "sup.toml"
    text = (
        '[supervisor]\nstate_dir = "s"\nlog_dir = "l"\ngpu_backend = "none"\n[[servers]]\n'
        f'name = {json.dumps(name)}\ncommand = ["python"]\nargs = ["--model-path", "m"]\n'
    )
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(path, env={})
    assert "servers[0].name" in info.value.format_errors()


def test_every_valid_name_stays_inside_its_directories(tmp_path: Path) -> None:
    """Log files (`log_dir/<name>.log`) and forensics bundles (`…/forensics/<ts>-<name>-<id>`) resolve inside."""
    pattern = ServerConfig.model_fields["name"].metadata[0].pattern
    for name in ["a", "0", "a-b_c", "z" * 63, "9--_"]:
        assert re.fullmatch(pattern, name)
        for root, leaf in (
            (tmp_path / "log", f"{name}.log"),
            (tmp_path / "forensics", f"20260101T000000-{name}-abc123"),
        ):
            assert (root / leaf).resolve().parent == root.resolve()


def test_group_readable_token_files_get_a_warning(tmp_path: Path) -> None:
    """check-config warns, naming the file, when a token or key file is readable by group or world."""
    token, key = tmp_path / "token", tmp_path / "key"
    token.write_text("control-token-value\n")
    key.write_text("sk-key-value\n")
    token.chmod(0o644)
    key.chmod(0o600)
    (tmp_path / "sup.toml").write_text(
        '[supervisor]\nstate_dir = "s"\nlog_dir = "l"\ngpu_backend = "none"\n'
        '[supervisor.http]\ntoken_file = "token"\n[[servers]]\nname = "a"\n'
        f'command = [{json.dumps(sys.executable)}, "-m", "no_such_module"]\n'
        'args = ["--model-path", "m"]\napi_key_file = "key"\n'
    )
    result = subprocess.run(
        [sys.executable, "-m", "supervisor.cli", "check-config", "--config", str(tmp_path / "sup.toml")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert warnings == [f"warning: {token} is readable by everyone (mode 0644); chmod 600 it"]
