"""Secrets: found in argv, env and key files, masked in argv, env, free text and nested JSON."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from policies.argv import redact as redact_argv
from policies.secrets import redact_env, scrub
from supervisor.config import Config, load_config
from supervisor.records.incident import Incident
from supervisor.redaction import hide, loose_permissions, register, server_api_key

BASE = """
[supervisor]
state_dir = "state"
log_dir = "log"
gpu_backend = "none"
{http}
[[servers]]
name = "main"
command = ["python", "-m", "sglang.launch_server"]
args = {args}
gpus = [0]
{extra}
"""


def config(tmp_path: Path, args: str, extra: str = "", http: str = "") -> Config:
    path = tmp_path / "sup.toml"
    path.write_text(BASE.format(args=args, extra=extra, http=http))
    return load_config(path, env={})


@pytest.mark.unit
def test_redact_argv_hides_both_key_flags_in_both_forms() -> None:
    """`--api-key X`, `--api-key=X` and `--admin-api-key` values become `***`; nothing else changes."""
    argv = ["python", "--api-key", "k1", "--admin-api-key=k2", "--port", "30000", "--api-key"]
    assert redact_argv(argv) == [
        "python",
        "--api-key",
        "***",
        "--admin-api-key=***",
        "--port",
        "30000",
        "--api-key",
    ]


@pytest.mark.unit
def test_redact_env_and_scrub_nested_values() -> None:
    """Secret-looking variables are masked by name; known values are masked inside any string, key or list."""
    assert redact_env({"HF_TOKEN": "t", "PATH": "/bin"}) == {"HF_TOKEN": "***", "PATH": "/bin"}
    data = {"line": "server_args api_key='sk-123456'", "list": ("a sk-123456 b",), "sk-123456": 1, "n": 3}
    assert scrub(data, ["sk-123456"]) == {
        "line": "server_args api_key='***'",
        "list": ("a *** b",),
        "***": 1,
        "n": 3,
    }
    assert scrub("abc", ["ab"]) == "abc", "values too short to be keys are not masked"


@pytest.mark.unit
@pytest.mark.parametrize(
    ("args", "extra", "want"),
    [
        ('["--model-path", "m", "--api-key", "sk-argv-1"]', "", "sk-argv-1"),
        ('["--model-path", "m", "--api-key=sk-argv-2"]', "", "sk-argv-2"),
        ('["--model-path", "m", "--admin-api-key", "sk-admin"]', "", None),
        ('["--model-path", "m"]', 'api_key_file = "key"', "sk-file-3"),
        ('["--model-path", "m"]', '[servers.env]\nSGLANG_API_KEY = "sk-env-4"', "sk-env-4"),
        ('["--model-path", "m"]', "", None),
    ],
)
def test_server_api_key_from_argv_file_or_env(
    tmp_path: Path, args: str, extra: str, want: str | None
) -> None:
    """The key the probes present: argv (both forms), else the key file, else the env; an admin key alone needs none."""
    (tmp_path / "key").write_text("sk-file-3\n")
    assert server_api_key(config(tmp_path, args, extra).servers[0]) == want


@pytest.mark.unit
def test_public_status_needs_a_token_or_an_explicit_flag(tmp_path: Path) -> None:
    """Binding beyond loopback loads with a token file or with allow_public_without_token, not otherwise."""
    (tmp_path / "token").write_text("t0ken-value\n")
    args = '["--model-path", "m"]'
    with_token = '[supervisor.http]\nhost = "0.0.0.0"\ntoken_file = "token"\n'
    allowed = '[supervisor.http]\nhost = "::"\nallow_public_without_token = true\n'
    assert config(tmp_path, args, http=with_token).supervisor.http.host == "0.0.0.0"
    assert config(tmp_path, args, http=allowed).supervisor.http.allow_public_without_token
    assert config(tmp_path, args, http='[supervisor.http]\nhost = "::1"\n').supervisor.http.host == "::1"


@pytest.mark.unit
def test_loose_secret_files_are_named(tmp_path: Path) -> None:
    """A key file readable by group or world gets a warning naming it and the fix; 0600 gets none."""
    key = tmp_path / "key"
    key.write_text("secret")
    os.chmod(key, 0o600)
    assert loose_permissions(key) is None
    os.chmod(key, 0o640)
    assert "its group" in str(loose_permissions(key))
    os.chmod(key, 0o644)
    warning = str(loose_permissions(key))
    assert "everyone" in warning and "chmod 600" in warning


@pytest.mark.unit
def test_incident_json_never_carries_a_key() -> None:
    """argv before/after and evidence of an incident (journal, /incidents, alerts) are masked."""
    register("sk-registered-77")
    incident = Incident(
        "i1",
        "main",
        "crash",
        0.0,
        evidence={"log": "ServerArgs(api_key='sk-registered-77')"},
        argv_before=("python", "--api-key", "sk-registered-77"),
        argv_after=("python", "--api-key=sk-registered-77"),
    )
    text = str(incident.to_json()) + str(incident.redacted())
    assert "sk-registered-77" not in text
    assert hide("x sk-registered-77 y") == "x *** y"
