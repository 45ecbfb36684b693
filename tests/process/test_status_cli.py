"""`sglang-supervisor status` as a process: `--watch` outlives a daemon that is not there yet, and a closed pipe
(`status | head -1`) ends it without a traceback."""

from __future__ import annotations

import contextlib
import http.server
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

from tests.support.ports import free_port
from tests.support.wait import wait_for

ROOT = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "supervisor.cli", "status"]


def document(servers: int) -> bytes:
    """A /status document with `servers` serving servers."""
    return json.dumps(
        {
            "status_line": "serving",
            "generated_at": 1.7e9,
            "servers": [
                {"name": f"s{i}", "role": "unified", "state": "serving", "since": 1.7e9, "gpus": [i]}
                for i in range(servers)
            ],
        }
    ).encode()


@contextlib.contextmanager
def status_server(port: int, body: bytes) -> Iterator[None]:
    """A stand-in daemon answering /status on `port` (loopback) until the block ends."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            return

    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield
    finally:
        server.shutdown()
        server.server_close()


def test_watch_keeps_trying_until_the_daemon_answers() -> None:
    """--watch on a port nobody listens on says since when it is unreachable, then shows the daemon once it is up."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [*CLI, "--url", url, "--watch", "0.1", "--count", "600"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    out: list[str] = []
    stdout, stderr = proc.stdout, proc.stderr
    assert stdout is not None and stderr is not None
    reader = threading.Thread(target=lambda: out.extend(iter(stdout.readline, "")), daemon=True)
    reader.start()
    try:
        wait_for(
            lambda: any("daemon unreachable since" in line for line in out), 30, "the unreachable screen"
        )
        assert proc.poll() is None
        with status_server(port, document(1)):
            wait_for(lambda: any(line.startswith("s0 ") for line in out), 30, "the status screen")
        assert proc.poll() is None
    finally:
        proc.kill()
        proc.wait(timeout=10)
    assert "Traceback" not in stderr.read()


def test_status_into_a_closed_pipe_ends_quietly() -> None:
    """`status | head -1` (once with a long screen, and --watch) prints one line, no traceback, exit 141."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with status_server(port, document(3000)):
        for extra in ("", "--watch 0.05 --count 50"):
            script = f"{' '.join(CLI)} --url {url} {extra} | head -1; echo rc=${{PIPESTATUS[0]}} >&2"
            done = subprocess.run(
                ["bash", "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60
            )
            assert len(done.stdout.splitlines()) == 1, done.stdout[:200]
            assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr, done.stderr
            assert done.stderr.strip().splitlines()[-1] == "rc=141"  # as a Unix tool killed by SIGPIPE
