"""`sglang-supervisor status`: the `/status` document as one screen, once or `--watch`ed.

The screen says what runs against what is configured (`fallback: +--flag  -(--flag value)  ~--flag old → new`),
one `RUNG` line per active ladder, what the next launch changes, and the time of the document. `--watch` never
gives up: while the daemon does not answer (a restart, a handover) it shows since when and keeps trying. A closed
pipe (`status | head`) ends it quietly, as Unix tools end.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import urllib.request
from collections.abc import Callable
from typing import Any

from supervisor.reporting.argv_view import diff_words

CLEAR = "\033[2J\033[H"
EXIT_SIGPIPE = 128 + signal.SIGPIPE


def fetch(url: str, timeout: float = 5.0) -> Any:
    """The `/status` document (OSError or ValueError when the daemon does not answer with one)."""
    with urllib.request.urlopen(url.rstrip("/") + "/status", timeout=timeout) as resp:
        return json.loads(resp.read(8 * 2**20))


def clock(ts: float | None) -> str:
    """Wall time as HH:MM:SS (local), `-` when unknown."""
    return time.strftime("%H:%M:%S", time.localtime(ts)) if ts else "-"


def ago(ts: float | None, now: float | None = None) -> str:
    """Seconds, minutes or hours since `ts` (wall), compact."""
    if not ts:
        return "-"
    s = max(0, int((now if now is not None else time.time()) - ts))
    return f"{s}s" if s < 120 else f"{s // 60}m" if s < 7200 else f"{s // 3600}h"


def render_status(body: dict[str, Any]) -> str:
    """One screen: per server state, since, PID, GPUs, restarts; the flags against the config, a line per
    active ladder, what the next launch changes; last incident; startup progress; the document's time."""
    as_of = body.get("generated_at")
    head = f"daemon: {body.get('status_line', body.get('state'))}"
    lines = [f"{head}   as of {clock(as_of)}" if as_of else head, ""]
    lines.append(f"{'SERVER':<12} {'ROLE':<8} {'STATE':<11} {'SINCE':>6} {'PID':>8} {'GPUS':<16} RESTARTS")
    for s in body.get("servers", []):
        gpus = ",".join(str(g) for g in s.get("gpus", [])) or "-"
        lines.append(
            f"{s['name']:<12} {s['role']:<8} {s['state']:<11} {ago(s.get('since'), as_of):>6} "
            f"{s.get('pid') or '-':>8} {gpus:<16} {s.get('restarts', 0)}"
        )
        lines += _server_lines(s, as_of)
    if body.get("group"):
        from supervisor.group.report import render_group

        lines += ["", *render_group(body["group"])]
    return "\n".join(lines)


def _server_lines(s: dict[str, Any], as_of: float | None) -> list[str]:
    lines = [f"  why: {s['reason']}"] if s.get("reason") else []
    words = diff_words(s.get("flags") or {})
    if words:
        lines.append(f"  fallback: {'  '.join(words)}")
    for r in (s.get("fallback") or {}).get("rungs", []):
        done = diff_words(r) or r.get("ops", [])
        lines.append(f"  RUNG {r['key']} {r['level']} of {r['of']}: {'  '.join(done)}")
    pending = s.get("next_launch") or {}
    if pending.get("pending"):
        lines.append(f"  next launch: {'  '.join(diff_words(pending))}  ({pending.get('note')})")
    start = s.get("startup")
    if start:
        lines.append(f"  startup: waiting for {start.get('waiting_for') or 'the launch'}")
        if start.get("progress"):
            lines.append(f"  progress: {start['progress']}")
    last = s.get("last_incident")
    if last:
        lines.append(
            f"  last incident: {last['id']} {last['fault']} → {last['action']} "
            f"({ago(last['detected_at'], as_of)} ago)"
        )
    return lines


def unreachable(since: float, now: float, url: str, error: object) -> str:
    """The screen while the daemon does not answer."""
    return f"daemon unreachable since {clock(since)} ({int(now - since)} s): {url}: {error}\nstill trying…"


def show(
    url: str,
    as_json: bool,
    watch: float | None,
    count: int | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Print the status once (2 when the daemon does not answer), or every `watch` seconds until interrupted
    (or `count` screens); a closed pipe ends it quietly."""
    try:
        return _show(url, as_json, watch, count, sleep)
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # nothing left to flush at exit
        return EXIT_SIGPIPE
    except KeyboardInterrupt:
        return 130


def _show(
    url: str, as_json: bool, watch: float | None, count: int | None, sleep: Callable[[float], None]
) -> int:
    down_since: float | None = None
    shown = 0
    while True:
        try:
            body = fetch(url)
            down_since = None
            text = json.dumps(body, indent=1) if as_json else render_status(body)
        except (OSError, ValueError) as exc:
            if not watch:
                print(f"cannot reach the supervisor at {url}: {exc}", file=sys.stderr)
                return 2
            now = time.time()
            down_since = down_since or now
            text = unreachable(down_since, now, url, getattr(exc, "reason", exc))
        if not watch:
            print(text, flush=True)
            return 0
        print(CLEAR + text, flush=True)
        shown += 1
        if count is not None and shown >= count:
            return 0
        sleep(watch)
