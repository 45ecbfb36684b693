"""`import` of a server that runs in a container: the SGLang command inside, the supervisor in the same image,
or a refusal naming the container; `check-config` refuses a container client as a server's command."""

from __future__ import annotations

import io
import shlex
import tomllib
from pathlib import Path
from typing import Any

import pytest

from supervisor.config import Config, ConfigError, load_config, parse_config
from supervisor.config.prepare import prepare
from supervisor.importing.command import run_import

UNITS = Path(__file__).resolve().parents[1] / "data" / "units" / "containers"
SGLANG = ["python3", "-m", "sglang.launch_server", "--model-path", "/models/Qwen3-8B"]
ADVICE = "give the SGLang command it runs with `import -- python3 -m sglang.launch_server …`"


def _import(units: list[Path], command: list[str] | None = None) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = run_import(units, command, None, out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def _config(tmp_path: Path, text: str) -> Config:
    return parse_config(tomllib.loads(text), tmp_path, {})


def _suggested(summary: str) -> list[str]:
    """The suggested `run` of the summary, split as the shell splits it."""
    lines = summary.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("run the supervisor inside the image"))
    return shlex.split(lines[at + 1])


UNIT_TABLE: list[tuple[str, dict[str, Any]]] = [
    (
        "sglang-docker.service",
        {
            "command": ("python3", "-m", "sglang.launch_server"),
            "args": [
                "--model-path", "meta-llama/Llama-3.1-8B-Instruct", "--host", "0.0.0.0", "--port", "30000",
                "--tool-call-parser", "llama3", "--enable-metrics",
            ],
            "gpus": (0,), "paths": (), "env": {"HF_TOKEN": "hf_0123456789abcdefghij"},
            "http": ("0.0.0.0", True),
            "carried": ["--gpus", "all", "--shm-size", "32g", "-p", "30000:30000", "--ipc", "host", "--rm"],
            "client": "/usr/bin/docker", "image": "sglang-supervisor:v0.5.3-cu126",
            "check": "--ipc host: the container shares the host's /dev/shm",
        },
    ),
    (
        "sglang-qwen-podman.service",
        {
            "command": ("python3", "-m", "sglang.launch_server"),
            "args": [
                "--model-path", "/models/Qwen3-235B-A22B-FP8", "--tp", "4", "--host", "0.0.0.0", "--port", "30010",
                "--reasoning-parser", "qwen3", "--tool-call-parser", "qwen", "--enable-metrics",
            ],
            "gpus": (0, 1, 2, 3), "paths": tuple(f"/dev/nvidia{n}" for n in (4, 5, 6, 7)),
            "env": {"SGLANG_HEALTH_CHECK_TIMEOUT": "60"}, "http": ("127.0.0.1", False),
            "carried": ["--device", "nvidia.com/gpu=7", "--network", "host", "--shm-size", "64g", "--replace"],
            "client": "/usr/bin/podman", "image": "sglang-supervisor:v0.5.3-cu126",
            "check": "--env-file /etc/sglang/qwen235.env: cannot read it here",
        },
    ),
    (
        "sglang-nerdctl.service",
        {
            "command": ("python3", "-m", "sglang.launch_server"),
            "args": [
                "--model-path", "/models/GLM-4.5-Air-FP8", "--tp-size", "2", "--host", "0.0.0.0", "--port", "8000",
                "--tool-call-parser", "glm45", "--reasoning-parser", "glm45", "--enable-metrics",
            ],
            "gpus": (0, 1), "paths": (), "env": {"SGLANG_ENABLE_JIT_DEEPGEMM": "0"},
            "http": ("0.0.0.0", True),
            "carried": ["--namespace", "k8s.io", "--gpus", '"device=0,1"', "-e", "NVIDIA_DRIVER_CAPABILITIES=compute,utility"],
            "client": "/usr/local/bin/nerdctl", "image": "sglang-supervisor:v0.5.3",
            "check": "Restart=on-failure",
        },
    ),
    (
        "sglang-router-wrapped.service",
        {
            "command": ("python3", "-m", "sglang_router.launch_router"),
            "args": ["--worker-urls", "http://127.0.0.1:30000", "--host", "0.0.0.0", "--port", "8000"],
            "gpus": (), "paths": (), "env": {}, "http": ("127.0.0.1", False),
            "carried": ["container", "run", "--net", "host", "--name", "sglang-router"],
            "client": "docker", "image": "sglang-supervisor:v0.5.3",
            "check": None,
        },
    ),
]  # fmt: skip


@pytest.mark.parametrize(("unit", "want"), UNIT_TABLE, ids=[u for u, _ in UNIT_TABLE])
def test_container_units_import_for_the_supervisor_in_the_image(
    tmp_path: Path, unit: str, want: dict[str, Any]
) -> None:
    """docker, podman and nerdctl units: the command is SGLang's as it runs inside the image, the args as
    today's import infers them, env from -e/--env-file, GPUs as the container sees them; the suggested run
    carries the container's options, the config bind and the stop timeout, in the image built FROM it."""
    code, text, summary = _import([UNITS / unit])
    assert code == 0, summary
    config = _config(tmp_path, text)
    (server,) = config.servers
    assert server.command == want["command"] and list(server.args) == want["args"]
    assert (server.gpus, tuple(map(str, server.gpu_device_paths))) == (want["gpus"], want["paths"])
    assert server.env == want["env"]
    http = config.supervisor.http
    assert (http.host, http.allow_public_without_token) == want["http"]
    assert (str(config.supervisor.state_dir), str(config.supervisor.log_dir)) == (
        "/var/lib/sglang-supervisor",
        "/var/log/sglang-supervisor",
    )
    run = _suggested(summary)
    assert run[0] == want["client"]
    assert all(word in run for word in want["carried"]), (want["carried"], run)
    assert "--init" not in run and "--env-file" not in run
    assert run[run.index("--stop-timeout") + 1] == "180"
    assert "/etc/sglang-supervisor/config.toml:/etc/sglang-supervisor/config.toml:ro" in run
    image = run.index(want["image"])
    assert run[image - 2 : image] == ["--entrypoint", "/opt/sglang-supervisor/venv/bin/sglang-supervisor"]
    assert run[image + 1 :] == ["run", "--config", "/etc/sglang-supervisor/config.toml"]
    assert ("127.0.0.1:9400:9400" in run) == want["http"][1], "published only outside the host's network"
    assert "examples/Dockerfile" in summary and "runbook.md#running-in-a-container" in summary
    if want["check"]:
        assert want["check"] in summary


def test_the_summary_never_shows_the_token_and_the_file_is_private(tmp_path: Path) -> None:
    """`--env HF_TOKEN` from the unit's Environment=: in [servers.env] of a 0600 file, never on stderr."""
    target = tmp_path / "config.toml"
    err = io.StringIO()
    assert run_import([UNITS / "sglang-docker.service"], None, target, out=io.StringIO(), err=err) == 0
    assert "hf_0123456789abcdefghij" not in err.getvalue()
    assert target.stat().st_mode & 0o077 == 0
    assert f"{target}:/etc/sglang-supervisor/config.toml:ro" in _suggested(err.getvalue())


def test_env_file_and_passthrough_as_docker_builds_them(tmp_path: Path) -> None:
    """--env-file first (a line verbatim, quotes kept; a bare NAME from the client's env), then -e in order;
    NVIDIA_* stays on the run line for the runtime; an unknown `-e NAME` is passed on there, and said."""
    env_file = tmp_path / "sglang.env"
    env_file.write_text('# ops\n  QUOTED="a b"\nSGLANG_LOG=1\nFROM_CLIENT\nNVIDIA_VISIBLE_DEVICES=2,3\n')
    command = [
        "FROM_CLIENT=yes", "docker", "run", "--env-file", str(env_file), "-e", "SGLANG_LOG=2", "-e", "UNKNOWN",
        "--shm-size", "8g", "lmsysorg/sglang:v1", *SGLANG, "--tp", "2",
    ]  # fmt: skip
    code, text, summary = _import([], command)
    assert code == 0, summary
    (server,) = _config(tmp_path, text).servers
    assert server.env == {"QUOTED": '"a b"', "SGLANG_LOG": "2", "FROM_CLIENT": "yes"}
    assert server.gpus == (0, 1) and server.gpu_device_paths == (Path("/dev/nvidia2"), Path("/dev/nvidia3"))
    run = _suggested(summary)
    assert run[run.index("-e") : run.index("-e") + 4] == ["-e", "NVIDIA_VISIBLE_DEVICES=2,3", "-e", "UNKNOWN"]
    assert "-e UNKNOWN: passed from the environment of whoever runs the client" in summary


@pytest.mark.parametrize(
    ("gpu_flags", "tp", "gpus", "paths", "said"),
    [
        (["--gpus", '"device=4,5"'], "2", (0, 1), ("/dev/nvidia4", "/dev/nvidia5"), "host GPU 4 → 0, 5 → 1"),
        (["--gpus", "device=0,1"], "2", (0, 1), (), "gpus: [0, 1] (tp 2"),
        (["--gpus", "2"], "2", (0, 1), (), "gpus: [0, 1]"),
        (["--gpus", "1"], "2", (0, 1), (), "the container sees 1 GPU(s)"),
        (["--gpus", "count=all"], "4", (0, 1, 2, 3), (), "shows every GPU inside"),
        (["--device", "nvidia.com/gpu=6", "--device", "nvidia.com/gpu=7"], "2", (0, 1), ("/dev/nvidia6", "/dev/nvidia7"), "host GPU 6 → 0, 7 → 1"),
        (["--gpus", '"device=GPU-8f2c,GPU-11ab"'], "2", (0, 1), (), "names GPUs by UUID"),
        ([], "1", (0,), (), "is given no GPUs"),
    ],
)  # fmt: skip
def test_gpus_as_the_container_sees_them(
    tmp_path: Path, gpu_flags: list[str], tp: str, gpus: tuple[int, ...], paths: tuple[str, ...], said: str
) -> None:
    """Host GPUs by index are 0… inside under their own device nodes; a count or `all` keeps the indices; a
    UUID, too few GPUs or none at all is said in the checks."""
    command = ["docker", "run", *gpu_flags, "--shm-size", "8g", "img:1", *SGLANG, "--tp", tp]
    code, text, summary = _import([], command)
    assert code == 0, summary
    (server,) = _config(tmp_path, text).servers
    assert (server.gpus, tuple(map(str, server.gpu_device_paths))) == (gpus, paths)
    assert said in summary


def test_a_longer_stop_timeout_is_kept_and_a_status_port_already_published_is_not_added() -> None:
    """`--stop-timeout 300` stays (longer than the drain budget); `-p 9400:9400` given already is not doubled."""
    command = [
        "docker",
        "run",
        "--stop-timeout",
        "300",
        "-p",
        "9400:9400",
        "--shm-size",
        "8g",
        "img:1",
        *SGLANG,
    ]
    code, _, summary = _import([], command)
    run = _suggested(summary)
    assert code == 0 and run[run.index("--stop-timeout") + 1] == "300"
    assert run.count("-p") == 1 and "127.0.0.1:9400:9400" not in run


@pytest.mark.parametrize(
    ("command", "said"),
    [
        (["docker", "run", "--name", "sg", "lmsysorg/sglang:latest"], "container sg (lmsysorg/sglang:latest) runs the image's default command"),
        (["docker", "run", "--name", "sg", "img", "/opt/start.sh", "--port", "30000"], "container sg (img) runs `/opt/start.sh --port 30000`, not an SGLang command"),
        (["docker", "run", "--entrypoint", "/bin/tini", "img", "--", *SGLANG], "(--entrypoint /bin/tini), not an SGLang command"),
        (["podman", "run", "img", "bash", "-c", "python3 -m sglang.launch_server | tee /log"], "the container of image img runs `bash -c`: the script uses '|'"),
        (["docker", "run", "--name", "sg", "--frobnicate", "img", *SGLANG], "container sg: docker run: option --frobnicate is not one the import knows"),
        (["docker", "compose", "up"], "`docker compose` starts containers through its daemon or API, perhaps several"),
        (["kubectl", "run", "sg", "--image=lmsysorg/sglang"], "`kubectl` starts containers"),
        (["bash", "-c", "exec docker start -a sglang"], "`docker inspect sglang` shows the command"),
    ],
)  # fmt: skip
def test_a_container_without_a_recognisable_sglang_command_is_refused(command: list[str], said: str) -> None:
    """No command, a script, another entrypoint, a shell script that does more, an unknown option, compose or
    kubectl, `docker start`: exit 1, one line naming the container and what to do, nothing on stdout."""
    code, text, summary = _import([], command)
    assert (code, text) == (1, "")
    assert len(summary.splitlines()) == 1 and said in summary, summary
    assert "import --" in summary and "examples/Dockerfile" in summary


def test_refusal_of_a_unit_writes_nothing(tmp_path: Path) -> None:
    """A refused unit with `-o FILE`: exit 1, the unit named, no file written."""
    target = tmp_path / "config.toml"
    err = io.StringIO()
    unit = UNITS / "sglang-start-existing.service"
    assert run_import([unit], None, target, out=io.StringIO(), err=err) == 1
    assert not target.exists()
    assert (
        err.getvalue().startswith("import: sglang-start-existing.service: `docker start`")
        and ADVICE in err.getvalue()
    )


def test_a_container_is_imported_alone() -> None:
    """A container unit with another unit: refused (its supervisor runs in its image), the container named."""
    host_unit = UNITS.parent / "kimi-k25-eagle3.service"
    code, text, summary = _import([UNITS / "sglang-docker.service", host_unit])
    assert (code, text) == (1, "")
    assert "container sglang (lmsysorg/sglang:v0.5.3-cu126) is imported alone" in summary


CONFIG = """
[supervisor]
state_dir = "{tmp}/state"
log_dir = "{tmp}/log"
gpu_backend = "none"
[[servers]]
name = "main"
command = {command}
args = ["--model-path", "Qwen/Qwen3-8B"]
gpus = [0]
"""


@pytest.mark.parametrize(
    ("command", "client"),
    [
        (["/usr/bin/docker", "run", "--gpus", "all", "lmsysorg/sglang", "python3"], "docker"),
        (["/opt/nowhere/podman", "run", "img"], "podman"),
        (["docker", "compose", "up"], "docker compose"),
        (["kubectl", "exec", "pod", "--", "python3"], "kubectl"),
        (["nerdctl", "run", "img"], "nerdctl"),
    ],
)
def test_check_config_refuses_a_container_client_as_the_command(
    tmp_path: Path, command: list[str], client: str
) -> None:
    """A server whose command is a container client is a config error at `servers[i].command`, found or not
    on this host: the supervisor would own the client, not the container; run it inside the container."""
    path = tmp_path / "sup.toml"
    path.write_text(CONFIG.format(tmp=tmp_path, command=str(command).replace("'", '"')))
    with pytest.raises(ConfigError) as caught:
        prepare(load_config(path, env={}))
    (error,) = caught.value.errors
    assert error.path == "servers[0].command (main)" and error.value == command[0]
    assert f"the supervisor would own the {client} process, not the container" in error.allowed
    assert "leaves the container on the GPUs" in error.allowed
    assert "runbook.md#running-in-a-container" in error.allowed
