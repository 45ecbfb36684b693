"""`check-config` says when a PD deployment's environment turns SGLang's own PD detection off, and when its router
sends the decodes to a bootstrap endpoint they cannot reach (never refuses)."""

from __future__ import annotations

from pathlib import Path

from supervisor.config import load_config
from supervisor.config.pd_checks import pd_warnings, router_warnings

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "pd-1p1d.toml"


def _config(tmp_path: Path, prefill_env: str = "", decode_env: str = "") -> Path:
    text = EXAMPLE.read_text()
    text = text.replace("gpus = [0, 1, 2, 3]\n", f"gpus = [0, 1, 2, 3]\n{prefill_env}\n", 1)
    text = text.replace(
        'gpus = [4, 5, 6, 7]\ndepends_on = ["prefill"]\n',
        f'gpus = [4, 5, 6, 7]\ndepends_on = ["prefill"]\n{decode_env}\n',
        1,
    )
    path = tmp_path / "pd.toml"
    path.write_text(text)
    return path


def test_the_shipped_pd_example_keeps_sglangs_own_detection(tmp_path: Path) -> None:
    assert pd_warnings(load_config(_config(tmp_path)), {}) == []


def test_production_timeouts_leave_the_supervisor_the_only_detector(tmp_path: Path) -> None:
    """SGLANG_DISAGGREGATION_{BOOTSTRAP,WAITING}_TIMEOUT=100000 (production recipes): one warning per side."""
    cfg = load_config(
        _config(
            tmp_path,
            'env = { SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT = "100000" }',
            'env = { SGLANG_DISAGGREGATION_WAITING_TIMEOUT = "100000" }',
        )
    )
    found = pd_warnings(cfg, {})
    assert len(found) == 2
    assert found[0].startswith("servers[0].env (prefill): SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT=100000")
    assert "the supervisor is the only detector" in found[1] and "(decode)" in found[1]


def test_the_daemons_own_environment_counts_and_a_long_heartbeat_is_said(tmp_path: Path) -> None:
    """The servers inherit the daemon's environment; a heartbeat that keeps a dead prefill 100 s is a warning."""
    cfg = load_config(
        _config(tmp_path, decode_env='env = { SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL = "50" }')
    )
    found = pd_warnings(cfg, {"SGLANG_DISAGGREGATION_WAITING_TIMEOUT": "100000"})
    assert len(found) == 2
    assert "drops a dead prefill only after 100 s" in found[1]


def test_the_shipped_routers_workers_match_the_pair(tmp_path: Path) -> None:
    assert router_warnings(load_config(_config(tmp_path))) == []


def test_a_router_without_the_prefills_bootstrap_port_is_said(tmp_path: Path) -> None:
    """`--prefill URL` without the port, or with another one: the decodes are told where no bootstrap server is."""
    path = _config(tmp_path)
    for wrong, shown in (
        ('"http://127.0.0.1:30000",\n', "(no bootstrap port)"),
        ('"http://127.0.0.1:30000", "8999",\n', "8999"),
    ):
        text = EXAMPLE.read_text().replace('"http://127.0.0.1:30000", "8998",\n', wrong)
        path.write_text(text)
        (found,) = router_warnings(load_config(path))
        assert found.startswith(f"servers[2].args (router): --prefill http://127.0.0.1:30000 {shown}: ")
        assert "bootstraps on 8998" in found and "every request through this router fails" in found


def test_a_router_with_the_roles_swapped_is_said(tmp_path: Path) -> None:
    path = _config(tmp_path)
    text = EXAMPLE.read_text().replace(
        '"--decode", "http://127.0.0.1:30001"', '"--decode", "http://127.0.0.1:30000"'
    )
    path.write_text(text)
    assert router_warnings(load_config(path)) == [
        "servers[2].args (router): --decode http://127.0.0.1:30000 is the prefill 'prefill' of this config"
    ]
