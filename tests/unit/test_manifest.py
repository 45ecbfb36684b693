"""check-config --manifest: a Kubernetes pod held against the config it runs (stop budget, probes, /dev/shm, GPUs)."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import pytest
import yaml

from supervisor.config import Config, load_config
from supervisor.config.manifest import ManifestError, check_manifest
from supervisor.config.stopbudget import advice, stop_budget

ROOT = Path(__file__).resolve().parents[2]
MANIFEST = (ROOT / "examples" / "kubernetes.yaml").read_text()


@pytest.fixture
def config(tmp_path: Path) -> Config:
    token = tmp_path / "token"
    token.write_text("t\n")
    return load_config(
        ROOT / "examples" / "container.toml", env={"SGLSUP_SUPERVISOR__HTTP__TOKEN_FILE": str(token)}
    )


def check(tmp_path: Path, config: Config, text: str) -> list[str]:
    path = tmp_path / "pod.yaml"
    path.write_text(text)
    return check_manifest(path, config)


def test_the_stop_budget_is_the_drain_the_reap_and_the_flush(config: Config) -> None:
    """Defaults: drain_grace_s 30 + release_deadline_s 60 + 5 s alert flush + 5 s exit = 100 s, inside 180 s."""
    budget = stop_budget(config)
    assert budget.seconds == 30 + 60 + 5 + 5
    assert budget.why.startswith("drain_grace_s 30 (kimi) + release_deadline_s 60")
    line, short = advice(budget)
    assert not short and line.startswith(f"stop budget: {budget.seconds} s")


def test_a_drain_shorter_than_the_forensics_counts_the_forensics() -> None:
    """drain_grace_s 5: a stop during a recovery first waits for its 10 s of forensics, so 10 s count, not 5."""
    budget = stop_budget(load_config(ROOT / "examples" / "simulator.toml", env={}))
    assert budget.seconds == 10 + 60 + 5 + 5
    assert budget.why.startswith("forensics 10 + release_deadline_s 60")


def test_a_drain_longer_than_the_shipped_timeouts_is_a_warning(tmp_path: Path) -> None:
    """drain_grace_s 300: the budget passes the shipped 180 s, and the advice says to raise them."""
    config = load_config(
        ROOT / "examples" / "simulator.toml", env={"SGLSUP_SERVERS__SIM__DRAIN_GRACE_S": "300"}
    )
    line, short = advice(stop_budget(config))
    assert short and "raise them" in line


def test_the_shipped_manifest_fits_the_shipped_config(tmp_path: Path, config: Config) -> None:
    """No warning for examples/kubernetes.yaml against examples/container.toml."""
    assert check(tmp_path, config, MANIFEST) == []


@pytest.mark.parametrize(
    ("old", "new", "warning"),
    [
        ("terminationGracePeriodSeconds: 180", "terminationGracePeriodSeconds: 60",
         "spec.template.spec.terminationGracePeriodSeconds: 60 is shorter than the supervisor's stop budget of 100 s"),
        ("terminationGracePeriodSeconds: 180\n", "",
         "spec.template.spec.terminationGracePeriodSeconds: 30 is shorter"),
        ("path: /servers/kimi/ready", "path: /health",
         "containers[0].readinessProbe.httpGet.path: '/health'; the supervisor answers /ready or /servers/kimi/ready"),
        ("httpGet: {path: /healthz, port: supervisor}\n            periodSeconds: 10",
         "httpGet: {path: /healthz, port: sglang}\n            periodSeconds: 10",
         "containers[0].livenessProbe.httpGet.port: 'sglang'; the supervisor listens on 9400"),
        ("emptyDir: {medium: Memory, sizeLimit: 32Gi}", "emptyDir: {}", "no memory-backed emptyDir at /dev/shm"),
        ("nvidia.com/gpu: 8", "nvidia.com/gpu: 4", "resources.limits.nvidia.com/gpu: 4; the config's servers own 8"),
        ("shareProcessNamespace: false", "shareProcessNamespace: true", "the pause container PID 1"),
    ],
)  # fmt: skip
def test_each_shortfall_of_the_pod_is_named_by_its_field(
    tmp_path: Path,
    config: Config,
    old: str,
    new: str,
    warning: str,
) -> None:
    """A manifest that would cut the drain short, probe the wrong endpoint, starve NCCL or hide PID 1 is warned of."""
    assert old in MANIFEST
    warnings = check(tmp_path, config, MANIFEST.replace(old, new, 1))
    assert any(warning in w for w in warnings), warnings
    assert all(w.startswith("Deployment sglang-kimi: spec.template.spec.") for w in warnings)


def test_a_bare_pod_is_checked_too(tmp_path: Path, config: Config) -> None:
    """kind: Pod has its spec at `spec`."""
    pod = "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  containers:\n    - {name: c, image: x}\n"
    warnings = check(tmp_path, config, pod)
    assert any(w.startswith("Pod p: spec.terminationGracePeriodSeconds: 30") for w in warnings), warnings
    assert any("livenessProbe: none" in w for w in warnings)


@pytest.mark.parametrize("text", ["x: [", "apiVersion: v1\nkind: Service\nmetadata: {name: s}\n"])
def test_an_unreadable_manifest_or_one_without_a_pod_is_refused(
    tmp_path: Path, config: Config, text: str
) -> None:
    """Bad YAML, or no workload in it: a ManifestError naming the file."""
    with pytest.raises(ManifestError, match=r"pod\.yaml"):
        check(tmp_path, config, text)


def test_the_shipped_pod_mounts_the_config_and_token_where_the_image_reads_them() -> None:
    """One projected volume (no subPath: edits reach a reload) puts config.toml at the entrypoint's --config and the
    token at container.toml's token_file, readable by the supervisor only."""
    deployment = next(d for d in yaml.safe_load_all(MANIFEST) if d["kind"] == "Deployment")
    spec = deployment["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["mountPath"]: m for m in spec["containers"][0]["volumeMounts"]}
    etc = mounts["/etc/sglang-supervisor"]
    assert "subPath" not in etc
    projected = volumes[etc["name"]]["projected"]
    files = {i["path"] for source in projected["sources"] for kind in source.values() for i in kind["items"]}
    raw = tomllib.loads((ROOT / "examples" / "container.toml").read_text())
    token = Path(raw["supervisor"]["http"]["token_file"])
    assert {"config.toml", token.name} == files and token.parent == Path("/etc/sglang-supervisor")
    assert projected["defaultMode"] == 0o400
    entrypoint = re.search(r"^ENTRYPOINT (.+)$", (ROOT / "examples" / "Dockerfile").read_text(), re.MULTILINE)
    assert entrypoint and json.loads(entrypoint.group(1))[-1] == "/etc/sglang-supervisor/config.toml"
