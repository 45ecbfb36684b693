"""The image built on a base holding the real SGLang 0.5.23 CPU install (tests/container/real_image.py), supervising
a real tiny model inside a container of a real engine: serving with its canary passed, a rank killed and recovered
inside, and `docker stop` with the documented timeout draining a request in flight before it exits 0.

One engine shows it: docker (the engine whose stop timeouts the README gives), a `dockerd` of this module's own as
the container tier starts it (tests/container/engines.py); the container tier's simulator tests run both engines.
It lives in this tier because the real server is this tier's: one at a time on 2 cores, under this tier's lock
(while the container tier, beside it in `make test`, runs the simulator).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.container.engines import Engine, ensure_packages, start_docker
from tests.container.real_image import REAL_TAG, build_real
from tests.container.running import CONFIG, ENTRYPOINT, STATUS_PORT, STOP_TIMEOUT_S, TOKEN, Box
from tests.real_serving.support import PROBES, READY_S, SCRIPTED, one_real_server_at_a_time
from tests.support.tools import CACHE
from tests.support.wait import wait_for
from tests.support.wheel import ensure_installed

PORT = 30000
MODELS = "/models"
DRAIN_GRACE_S = 120  # a request in flight has this long to finish when the container is stopped


def real_config() -> str:
    """The real server on CPU as the real-serving tier runs it, its state and logs in the container's folders, the
    image's `python3` (the SGLang install's) as its command."""
    args = ["--model-path", f"{MODELS}/{SCRIPTED}", "--tp-size", "1", "--host", "127.0.0.1", "--port", str(PORT),
            "--device", "cpu", "--attention-backend", "torch_native", "--mem-fraction-static", "0.05",
            "--max-total-tokens", "4096", "--enable-metrics", "--load-format", "safetensors",
            "--tool-call-parser", "qwen"]  # fmt: skip
    lines = [
        "[supervisor]",
        'state_dir = "/var/lib/sglang-supervisor"',
        'log_dir = "/var/log/sglang-supervisor"',
        'shm_dir = "/dev/shm"',
        'gpu_backend = "none"',
        "release_deadline_s = 30",
        "[supervisor.http]",
        'host = "0.0.0.0"',
        f"port = {STATUS_PORT}",
        f'token_file = "{TOKEN}"',
        "[[servers]]",
        'name = "real"',
        'command = ["python3", "-m", "sglang.launch_server"]',
        f"args = {json.dumps(args)}",
        f"startup_budget_s = {READY_S}",
        f"startup_silence_s = {READY_S}",
        f"drain_grace_s = {DRAIN_GRACE_S}",
        "[servers.probes]",
        *(f"{k} = {json.dumps(v)}" for k, v in PROBES.items()),
    ]
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    """A dockerd of this module's own, its storage in a private folder."""
    why = ensure_packages(CACHE / "engines.lock")
    if why is not None:
        pytest.skip(why)
    engine = start_docker(tmp_path_factory.mktemp("docker"))
    try:
        yield engine
    finally:
        engine.close()


@pytest.fixture(scope="module")
def box(
    engine: Engine, serving_python: Path, models: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Box]:
    """The real image built and one container of it serving the real server."""
    folder = tmp_path_factory.mktemp("docker-real")
    venv = serving_python.parent.parent
    imported, built = build_real(engine, ensure_installed().wheel, folder / "context", venv)
    print(
        f"the real base imported (SGLang 0.5.23 CPU venv): {imported:.1f} s; the Dockerfile built: {built:.1f} s"
    )
    Box.write(folder, real_config())
    options = ["--stop-timeout", str(STOP_TIMEOUT_S), "--shm-size", "2g", "-v", f"{models}:{MODELS}:ro"]
    with one_real_server_at_a_time():
        started = time.monotonic()
        box = Box.start(engine, folder, f"sglsup-real-{os.getpid()}", options, image=REAL_TAG)
        try:
            box.wait_serving(READY_S)
            print(f"docker run → serving (the real server on CPU): {time.monotonic() - started:.1f} s")
            yield box
        finally:
            box("rm", "-f", check=False)


def scheduler_pids(box: Box) -> list[int]:
    return [pid for pid, _, args in box.processes() if args.startswith("sglang::scheduler")]


def test_the_image_serves_the_real_server_with_its_canary_passed(box: Box) -> None:
    """PID 1 is the entrypoint, the daemon its child, the real `sglang.launch_server` of the image's python3 the
    daemon's child with its scheduler and detokenizer; the canary's tool call passed; `/generate` answers."""
    pid1 = box.exec("cat", "/proc/1/cmdline").stdout.rstrip("\0").split("\0")
    assert pid1[-len(ENTRYPOINT) :] == ENTRYPOINT
    assert CONFIG in pid1
    status = box.status()
    assert status is not None
    server = status["servers"][0]
    rows = {pid: (ppid, args) for pid, ppid, args in box.processes()}
    daemon = int(status["pid"])
    assert rows[daemon][0] == 1, "the daemon is PID 1's child"
    main = int(server["pid"])
    assert rows[main][0] == daemon and "sglang.launch_server" in rows[main][1], rows[main]
    titles = {args.split()[0] for ppid, args in rows.values() if ppid == main}
    assert {"sglang::scheduler", "sglang::detokenizer"} <= titles, titles
    canary = server["probes"]["probes"]["canary_tool"]
    assert canary["ok"] and canary["values"]["verdict"] == "pass", canary
    code, body = box.post("/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 4}}, PORT, 300)
    assert code == 200 and json.loads(body)["meta_info"]["completion_tokens"] == 4, (code, body)


def test_a_killed_rank_is_recovered_inside_the_container(box: Box) -> None:
    """`kill -KILL` of the scheduler inside: a `crash` incident, the tree killed and relaunched, serving again
    under a new main PID, one scheduler in the container."""
    before = box.wait_serving(READY_S)
    (scheduler,) = scheduler_pids(box)
    started = time.monotonic()
    box.exec("kill", "-KILL", str(scheduler))
    again = box.wait_server(
        lambda s: s["state"] == "serving" and s["pid"] != before["pid"], READY_S, "relaunched"
    )
    print(f"a rank killed → serving again: {time.monotonic() - started:.1f} s")
    incident = again["last_incident"]
    assert incident["fault"] == "crash" and incident["recovered_at"], incident
    assert again["restarts"] == before["restarts"] + 1
    assert len(scheduler_pids(box)) == 1, box.processes()


def test_docker_stop_drains_a_request_in_flight_and_exits_0(box: Box) -> None:
    """A long generation in flight when `docker stop --time 180` comes: it finishes (every token), then the daemon
    stops the server and PID 1 exits 0 with nothing of the container left."""
    box.wait_serving(READY_S)
    answer: list[tuple[int, str]] = []
    body = {"text": "hi", "sampling_params": {"max_new_tokens": 256, "ignore_eos": True}}
    client = threading.Thread(
        target=lambda: answer.append(box.post("/generate", body, PORT, 600)), daemon=True
    )
    client.start()

    wait_for(lambda: box.requests_running(PORT), 120, "the request running", interval=0.2)
    namespace = box.pid_namespace()
    code, took = box.stop("--time", str(STOP_TIMEOUT_S), timeout_s=STOP_TIMEOUT_S + 60)
    client.join(timeout=60)
    print(f"docker stop --time {STOP_TIMEOUT_S} with a real request in flight: {took:.1f} s, exit {code}")
    assert code == 0, box.logs()[-3000:]
    assert answer and answer[0][0] == 200, answer
    assert json.loads(answer[0][1])["meta_info"]["completion_tokens"] == 256, "drained: every token served"
    assert box.events("daemon.stopped") and box.events("init.exit")[-1]["status"] == 0
    assert not Box.alive_in(namespace)


def test_the_real_image_is_the_shipped_dockerfile(engine: Engine, box: Box) -> None:
    """The image is the shipped Dockerfile unchanged on the real base: its exec-form entrypoint, and SGLang
    0.5.23 importable by the image's python3."""
    assert engine.inspect(REAL_TAG)["Config"]["Entrypoint"] == ENTRYPOINT
    version = engine("run", "--rm", "--network", "none", "--entrypoint", "python3", REAL_TAG, "-c",
                     "import sglang; print(sglang.__version__)").stdout.strip()  # fmt: skip
    assert version == "0.5.23", version
