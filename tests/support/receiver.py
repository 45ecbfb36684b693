"""An HTTP receiver on loopback for webhook deliveries (the daemon's webhook sink, Alertmanager's receivers):
it keeps every JSON body it is sent, by path and with its arrival time, and can refuse one path for a while
(503, as an endpoint that is down) to make deliveries fail for real."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

_MAX_BODY = 1 << 20


@dataclass(frozen=True)
class Delivery:
    """One POST that reached the receiver."""

    path: str
    at: float  # Unix time of arrival
    body: Any
    accepted: bool


class Receiver:
    """A threaded HTTP server on 127.0.0.1 recording deliveries; `refuse(path)` answers 503 there until
    `accept(path)`."""

    def __init__(self) -> None:
        self.deliveries: list[Delivery] = []
        self.refused: set[str] = set()
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = min(int(self.headers.get("Content-Length") or 0), _MAX_BODY)
                raw = self.rfile.read(length)
                try:
                    body: Any = json.loads(raw or b"null")
                except ValueError:
                    body = raw.decode(errors="replace")
                accepted = receiver.record(self.path, body)
                self.send_response(200 if accepted else 503)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    def url(self, path: str) -> str:
        """The receiver's URL for `path` (which starts with /)."""
        return f"http://127.0.0.1:{self.port}{path}"

    def record(self, path: str, body: Any) -> bool:
        """Keep one delivery; whether it is accepted."""
        with self._lock:
            accepted = path not in self.refused
            self.deliveries.append(Delivery(path, time.time(), body, accepted))
        return accepted

    def refuse(self, path: str) -> None:
        """Answer 503 to every POST to `path` from now on."""
        with self._lock:
            self.refused.add(path)

    def accept(self, path: str) -> None:
        """Accept POSTs to `path` again."""
        with self._lock:
            self.refused.discard(path)

    def at(self, path: str) -> list[Delivery]:
        """The deliveries to `path`, in arrival order."""
        with self._lock:
            return [d for d in self.deliveries if d.path == path]

    def __enter__(self) -> Receiver:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)
