"""check-config --compose: a Compose service held against the config it runs (grace, signal, init, health, shm,
GPUs)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from supervisor.config import Config, load_config
from supervisor.config.compose import ComposeError, check_compose, seconds

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((ROOT / "examples" / "compose.yaml").read_text())


@pytest.fixture
def config(tmp_path: Path) -> Config:
    token = tmp_path / "token"
    token.write_text("t\n")
    return load_config(
        ROOT / "examples" / "container.toml", env={"SGLSUP_SUPERVISOR__HTTP__TOKEN_FILE": str(token)}
    )


def check(tmp_path: Path, config: Config, **changes: object) -> list[str]:
    """The shipped service with `changes` (None removes a key), checked."""
    service = {**COMPOSE["services"]["kimi"], **changes}
    service = {k: v for k, v in service.items() if v is not None}
    path = tmp_path / "compose.yaml"
    path.write_text(yaml.safe_dump({"services": {"kimi": service}}))
    return check_compose(path, config)


def test_the_shipped_compose_file_fits_the_shipped_container_config(tmp_path: Path, config: Config) -> None:
    assert check(tmp_path, config) == []


@pytest.mark.parametrize(("text", "value"), [("180s", 180.0), ("1m30s", 90.0), ("1h", 3600.0), ("500ms", 0.5),
                                             (45, 45.0), ("3 minutes", None), ("s", None)])  # fmt: skip
def test_compose_durations(text: object, value: float | None) -> None:
    assert seconds(text) == value


def test_a_grace_period_below_the_stop_budget_is_named(tmp_path: Path, config: Config) -> None:
    """A short grace, and none at all (Compose's 10 s default), are each one warning with the field path."""
    short = check(tmp_path, config, stop_grace_period="1m")
    assert short == [
        "services.kimi.stop_grace_period: 1m is shorter than the supervisor's stop budget of 100 s (drain_grace_s "
        "30 (kimi) + release_deadline_s 60 + alert flush 5 + exit 5): the engine's SIGKILL would end the "
        "container mid-drain"
    ]
    unset = check(tmp_path, config, stop_grace_period=None)
    assert len(unset) == 1 and unset[0].startswith("services.kimi.stop_grace_period: 10s is shorter")


def test_init_a_stop_signal_a_foreign_healthcheck_no_shm_and_missing_gpus_are_named(
    tmp_path: Path, config: Config
) -> None:
    found = check(
        tmp_path,
        config,
        init=True,
        stop_signal="SIGKILL",
        healthcheck={"test": ["CMD", "curl", "-f", "http://127.0.0.1:30000/health"]},
        ipc=None,
        shm_size="64m",
        deploy=None,
    )
    fields = [line.split(":")[0] for line in found]
    assert fields == [
        "services.kimi.stop_signal",
        "services.kimi.init",
        "services.kimi.healthcheck.test",
        "services.kimi.ipc/shm_size",
        "services.kimi.deploy.resources.reservations.devices",
    ], found
    assert check(tmp_path, config, ipc=None, shm_size="32gb") == []
    assert check(tmp_path, config, deploy=None, gpus="all") == []
    assert check(tmp_path, config, healthcheck={"disable": True}) == [
        "services.kimi.healthcheck: disabled; the image's checks the daemon's /healthz"
    ]


def test_a_file_without_services_or_unreadable_is_an_error(tmp_path: Path, config: Config) -> None:
    empty = tmp_path / "empty.yaml"
    empty.write_text("version: '3'\n")
    with pytest.raises(ComposeError, match="no services"):
        check_compose(empty, config)
    with pytest.raises(ComposeError, match="cannot read"):
        check_compose(tmp_path / "missing.yaml", config)
