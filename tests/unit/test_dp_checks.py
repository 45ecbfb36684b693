"""`check-config` notes a data-parallel server whose SGLang predates the one its per-rank signals were checked on
(never refuses, says nothing when the version cannot be told)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from supervisor.config import load_config
from supervisor.config.dp_checks import dp_notes

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "kimi-k25-8gpu.toml"
ENV = {"ALERT_WEBHOOK_URL": "https://alerts.example/hook", "ALERT_WEBHOOK_HMAC": "k"}


def _config(tmp_path: Path, tp_dp: str) -> Path:
    path = tmp_path / "dp.toml"
    path.write_text(EXAMPLE.read_text().replace('"--tp-size", "8",', tp_dp, 1))
    return path


def fixed(release: str | None) -> Callable[[Sequence[str]], str | None]:
    """A version reader that answers `release` for any command."""

    def version_of(command: Sequence[str]) -> str | None:
        del command
        return release

    return version_of


def test_an_older_sglang_at_dp_size_2_is_noted_and_a_checked_one_is_not(tmp_path: Path) -> None:
    cfg = load_config(_config(tmp_path, '"--tp-size", "4", "--dp-size", "2",'), ENV)

    notes = dp_notes(cfg, fixed("0.5.9"))
    assert len(notes) == 1 and "2 DP ranks on SGLang 0.5.9" in notes[0] and "whole-server lease" in notes[0]
    assert (
        dp_notes(cfg, fixed("0.5.23")) == dp_notes(cfg, fixed("0.6.0rc1")) == dp_notes(cfg, fixed(None)) == []
    )


def test_a_server_without_data_parallelism_is_never_noted(tmp_path: Path) -> None:
    cfg = load_config(_config(tmp_path, '"--tp-size", "8",'), ENV)

    assert dp_notes(cfg, fixed("0.4.0")) == []
