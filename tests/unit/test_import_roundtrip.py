"""`import` round trips: real-world units → TOML → the project's config loader → the args systemd would pass."""

from __future__ import annotations

import io
import tomllib
from pathlib import Path

from supervisor.config import Config, parse_config
from supervisor.importing.command import run_import

UNITS = Path(__file__).resolve().parents[1] / "data" / "units"
KIMI_ARGS = [
    "--model-path", "/shared/kimi-k2.5-int4", "--trust-remote-code", "--tp-size", "8",
    "--mem-fraction-static", "0.85", "--host", "0.0.0.0", "--port", "30000",
    "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", "/shared/kimi-eagle3",
    "--speculative-num-steps", "3", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4",
    "--num-continuous-decode-steps", "4", "--disable-custom-all-reduce", "--log-level", "info",
]  # fmt: skip
PD_WORKER = [
    "--model-path", "deepseek-ai/DeepSeek-V3.1", "--trust-remote-code", "--disaggregation-mode", "{mode}",
    "--disaggregation-transfer-backend", "mooncake", "--disaggregation-ib-device", "{ib}",
]  # fmt: skip
PARSERS = ["--tool-call-parser", "deepseekv31", "--reasoning-parser", "deepseek-v3"]


def _import(
    tmp_path: Path, units: list[Path], command: list[str] | None = None, **kw: str
) -> tuple[Config, str]:
    out, err = io.StringIO(), io.StringIO()
    code = run_import(units, command, None, parsers=kw.get("parsers", "add"), out=out, err=err)
    assert code == 0, err.getvalue()
    return parse_config(tomllib.loads(out.getvalue()), tmp_path, {}), err.getvalue()


def test_kimi_k25_eagle3_unit(tmp_path: Path) -> None:
    """The Kimi-K2.5 EAGLE-3 unit: its args as systemd passes them, then the family's parsers and metrics;
    GPUs from CUDA_VISIBLE_DEVICES (which leaves env), a 2400 s budget, the other Environment= values kept."""
    config, summary = _import(tmp_path, [UNITS / "kimi-k25-eagle3.service"])
    (server,) = config.servers
    assert server.name == "kimi-k25-eagle3" and server.role.value == "unified"
    assert server.command == ("/root/ml-env/bin/python3", "-m", "sglang.launch_server")
    tail = ["--tool-call-parser", "kimi_k2", "--reasoning-parser", "kimi_k2", "--enable-metrics"]
    assert list(server.args) == KIMI_ARGS + tail
    assert server.gpus == tuple(range(8))
    assert server.env == {"NCCL_P2P_LEVEL": "NVL", "SGLANG_ENABLE_SPEC_V2": "1"}
    assert server.startup_budget_s == 2400
    assert str(config.supervisor.state_dir) == "/var/lib/sglang-supervisor"
    assert str(config.supervisor.log_dir) == "/var/log/sglang-supervisor"
    assert (config.supervisor.http.host, config.supervisor.http.port) == ("127.0.0.1", 9400)
    assert "ProtectHome" in summary and "Restart=always" in summary


def test_kimi_unit_with_parsers_kept_warns_which_restart_they_avoid(tmp_path: Path) -> None:
    """`--parsers keep`: the args are exactly systemd's (plus metrics); the summary says the daemon fixes the
    parsers before the first launch."""
    config, summary = _import(tmp_path, [UNITS / "kimi-k25-eagle3.service"], parsers="keep")
    assert list(config.servers[0].args) == [*KIMI_ARGS, "--enable-metrics"]
    assert "--tool-call-parser is unset; the model family needs kimi_k2" in summary
    assert 'parser_policy = "fix"' in summary and "first launch" in summary


def test_pd_pair_and_router_become_one_config(tmp_path: Path) -> None:
    """A prefill, a decode and a router unit of one host → one config: roles from --disaggregation-mode and
    the router module, decode GPUs from --base-gpu-id (dropped: SGLang counts from 0 in what it is shown)."""
    config, summary = _import(
        tmp_path, [UNITS / "pd" / f"sglang-{r}.service" for r in ("prefill", "decode", "router")]
    )
    prefill, decode, router = config.servers
    assert [s.name for s in config.servers] == ["prefill", "decode", "router"]
    assert [s.role.value for s in config.servers] == ["prefill", "decode", "router"]
    worker = [t.format(mode="prefill", ib="mlx5_0") for t in PD_WORKER]
    assert list(prefill.args) == [
        *worker, "--disaggregation-bootstrap-port", "8998", "--tp", "4", "--host", "127.0.0.1", "--port", "30000",
        *PARSERS, "--enable-metrics",
    ]  # fmt: skip
    worker = [t.format(mode="decode", ib="mlx5_2") for t in PD_WORKER]
    assert list(decode.args) == [
        *worker,
        "--tp",
        "4",
        "--host",
        "127.0.0.1",
        "--port",
        "30001",
        *PARSERS,
        "--enable-metrics",
    ]
    assert "dropped --base-gpu-id 4" in summary
    assert (prefill.gpus, decode.gpus, router.gpus) == ((0, 1, 2, 3), (4, 5, 6, 7), ())
    assert prefill.env == {"SGLANG_HEALTH_CHECK_TIMEOUT": "60", "NCCL_IB_HCA": "mlx5_0,mlx5_1"}
    assert decode.probes.health_timeout_s == 75, "above SGLang's own 60 s health wait"
    assert list(router.args) == [
        "--pd-disaggregation", "--prefill", "http://127.0.0.1:30000", "8998",
        "--decode", "http://127.0.0.1:30001", "--host", "0.0.0.0", "--port", "8000",
    ]  # fmt: skip
    assert router.command[-1] == "sglang_router.launch_router"


def test_sglang_serve_with_a_missing_optional_environment_file(tmp_path: Path) -> None:
    """`sglang serve` with `EnvironmentFile=-/etc/default/…` absent: `${MODEL}` from Environment=, `$VAR` of
    the missing file expands to nothing (said), the family's parsers are added."""
    config, summary = _import(tmp_path, [UNITS / "qwen3-serve.service"])
    (server,) = config.servers
    assert server.command == ("/opt/sglang/.venv/bin/sglang", "serve")
    assert list(server.args) == [
        "--model-path", "Qwen/Qwen3-32B", "--port", "30000",
        "--tool-call-parser", "qwen", "--reasoning-parser", "qwen3", "--enable-metrics",
    ]  # fmt: skip
    assert "missing, allowed by '-'" in summary and "$SGLANG_EXTRA_ARGS" in summary
    assert server.gpus == (0,) and server.startup_budget_s == 1800


def test_sglang_serve_with_the_environment_file_present(tmp_path: Path) -> None:
    """The same unit with its EnvironmentFile= present: the file's values override Environment= (systemd's
    order) and `$SGLANG_EXTRA_ARGS` splits into words; the args are exactly what systemd passes."""
    env_file = tmp_path / "sglang-qwen3"
    env_file.write_text(
        '# ops\nMODEL=/models/Qwen3-32B-AWQ\nSGLANG_EXTRA_ARGS="--tp 2 --tool-call-parser qwen '
        '--reasoning-parser qwen3 --enable-metrics"\n'
    )
    unit = tmp_path / "qwen3-serve.service"
    unit.write_text(
        (UNITS / "qwen3-serve.service").read_text().replace("/etc/default/sglang-qwen3", str(env_file))
    )
    config, _ = _import(tmp_path, [unit])
    (server,) = config.servers
    assert list(server.args) == [
        "--model-path", "/models/Qwen3-32B-AWQ", "--port", "30000",
        "--tp", "2", "--tool-call-parser", "qwen", "--reasoning-parser", "qwen3", "--enable-metrics",
    ]  # fmt: skip
    assert server.gpus == (0, 1)
    assert server.env["SGLANG_EXTRA_ARGS"].startswith("--tp 2")


def test_quoted_json_escapes_prefixes_and_expansion(tmp_path: Path) -> None:
    """A single-quoted JSON argument, `"${VAR}"` with spaces, `$VAR` split, `\\x2d`, a comment inside the
    continuation, the `-` prefix: the args are systemd's; the API key is masked in the summary."""
    config, summary = _import(tmp_path, [UNITS / "yarn-json.service"])
    (server,) = config.servers
    json_arg = '{"rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}}'
    assert server.command == ("/usr/local/bin/python3.11", "-m", "sglang.launch_server")
    assert list(server.args) == [
        "--model-path", "/models/Meta-Llama-3.1-8B-Instruct", "--json-model-override-args", json_arg,
        "--served-model-name", "llama yarn 128k", "--tool-call-parser", "llama3",
        "--chunked-prefill-size", "4096", "--context-length", "131072",
        "--chat-template", "/etc/sglang/tool-chat.jinja", "--api-key=sk-local-0123456789", "--port", "30002",
        "--enable-metrics",
    ]  # fmt: skip
    assert server.startup_budget_s == 900
    assert "sk-local-0123456789" not in summary and "--api-key=***" in summary
    assert "exit status ignored" in summary


def test_command_line_after_double_dash(tmp_path: Path) -> None:
    """`import -- CUDA_VISIBLE_DEVICES=2,3 python -m sglang.launch_server …`: already split by the shell; the
    env assignment gives the GPUs; a secret-looking env value never reaches the summary."""
    command = [
        "CUDA_VISIBLE_DEVICES=2,3", "HF_TOKEN=hf_0123456789abcdef", "/opt/sglang/.venv/bin/python", "-m",
        "sglang.launch_server", "--model-path", "Qwen/Qwen2.5-72B-Instruct", "--tp", "2",
        "--tool-call-parser", "qwen25",
    ]  # fmt: skip
    config, summary = _import(tmp_path, [], command)
    (server,) = config.servers
    assert list(server.args) == [*command[5:], "--enable-metrics"]
    assert server.gpus == (2, 3) and server.env == {"HF_TOKEN": "hf_0123456789abcdef"}
    assert server.startup_budget_s == 1800
    assert "hf_0123456789abcdef" not in summary and "HF_TOKEN=***" in summary


def test_output_file_is_not_overwritten_without_force(tmp_path: Path) -> None:
    """`-o FILE` refuses an existing file (exit 1, untouched) unless `--force`; a config with secrets is 0600;
    a missing directory is made."""
    target = tmp_path / "config.toml"
    target.write_text("mine\n")
    err = io.StringIO()
    unit = [UNITS / "yarn-json.service"]
    assert run_import(unit, None, target, out=io.StringIO(), err=err) == 1
    assert target.read_text() == "mine\n" and "--force" in err.getvalue()
    assert run_import(unit, None, target, force=True, out=io.StringIO(), err=io.StringIO()) == 0
    assert "sglang.launch_server" in target.read_text()
    assert target.stat().st_mode & 0o077 == 0, "it holds an API key"
    fresh = tmp_path / "etc" / "sglang-supervisor" / "config.toml"
    assert run_import([UNITS / "kimi-k25-eagle3.service"], None, fresh, out=io.StringIO(), err=err) == 0
    assert fresh.stat().st_mode & 0o777 == 0o644, "no secret: readable like any config"


def test_pasted_exec_start_lines_on_stdin(tmp_path: Path) -> None:
    """`import -` with just `Environment=` and `ExecStart=` lines pasted (no section header), continuation included."""
    pasted = (
        'Environment="CUDA_VISIBLE_DEVICES=4,5"\n'
        "ExecStart=/opt/sglang/.venv/bin/python -m sglang.launch_server --model-path Qwen/Qwen3-8B \\\n"
        '    --tp 2 --served-model-name "qwen 8b" --tool-call-parser qwen --reasoning-parser qwen3\n'
    )
    out, err = io.StringIO(), io.StringIO()
    assert run_import([Path("-")], None, None, out=out, err=err, stdin=io.StringIO(pasted)) == 0, (
        err.getvalue()
    )
    (server,) = parse_config(tomllib.loads(out.getvalue()), tmp_path, {}).servers
    assert list(server.args) == [
        "--model-path", "Qwen/Qwen3-8B", "--tp", "2", "--served-model-name", "qwen 8b",
        "--tool-call-parser", "qwen", "--reasoning-parser", "qwen3", "--enable-metrics",
    ]  # fmt: skip
    assert server.gpus == (4, 5) and server.name == "qwen3"
