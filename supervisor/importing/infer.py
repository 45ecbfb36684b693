"""From what a server is started with today (`Source`) to a `[[servers]]` entry, saying what was inferred.

Rules:
- command: the launcher (`supervisor.importing.launchers`); the rest is `args`, read as SGLang's own parser
  reads them (`policies.argv`).
- role: `router` for the router module, else `prefill`/`decode` from `--disaggregation-mode`, else `unified`.
- gpus: the integers of `CUDA_VISIBLE_DEVICES` when the unit sets it (the supervisor sets that variable from
  `gpus`, so it leaves `env`); without it, tp × pp × dp GPUs (tp × pp with `--enable-dp-attention`, divided by
  `--nnodes`) from `--base-gpu-id` every `--gpu-id-step`; those two flags are then dropped, since SGLang counts
  from 0 in the GPUs the supervisor makes visible.
- startup_budget_s (`budget`): 2400 s for the large MoE families (Kimi, DeepSeek except R1 distills, GLM,
  MiniMax) and for names of 100B parameters or more, as examples/kimi-k25-8gpu.toml; 1800 s (the default) from
  30B or when the name gives no size; 900 s below 30B.
- parsers: the model family's (`policies.parsers_table`), set as the daemon's pre-launch fix would set them
  (`parsers="add"`), or left as they are with a warning (`parsers="keep"`).
- `--enable-metrics` is added: the progress lease that finds decode wedges and collective hangs reads `/metrics`.
- in a container (`Source.container`), the GPUs are then those the container sees (`supervisor.importing.suggest`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from policies import argv
from policies.ladders import Rung, apply_rungs, parse_op
from policies.parsers_table import FAMILIES, expected_parsers
from policies.pd import Role
from policies.plan import PARSER_KEY, build_argv, parser_ladder, parser_mismatches
from policies.secrets import redact_env
from supervisor.importing.incontainer import Container
from supervisor.importing.launchers import split_command
from supervisor.importing.source import Source

BIG_MOE_FAMILIES = ("kimi", "deepseek", "glm", "minimax")
BUDGET_LARGE_S, BUDGET_DEFAULT_S, BUDGET_SMALL_S = 2400, 1800, 900
HEALTH_PROBE_MARGIN_S = 15
_SIZE = re.compile(r"(?<![\d.])(\d+(?:\.\d+)?)b(?![a-z0-9])")
_HIDDEN_HOMES = ("/root/", "/home/")
_PATH_FLAGS = ("--model-path", "--tokenizer-path", "--speculative-draft-model-path")


@dataclass
class ServerPlan:
    """One `[[servers]]` entry and what the summary says about it."""

    name: str
    role: Role
    command: list[str]
    args: list[str]
    env: dict[str, str]
    gpus: list[int]
    startup_budget_s: int
    source: str
    health_timeout_s: int | None = None
    gpu_device_paths: list[str] = field(default_factory=list)
    container: Container | None = None  # the container it ran in: the supervisor runs in the same image
    expected: tuple[str | None, str | None] | None = None
    comments: dict[str, str] = field(default_factory=dict)  # TOML key → trailing comment
    arg_notes: dict[str, str] = field(default_factory=dict)  # flag key → why the import put it there
    removed: list[str] = field(default_factory=list)  # flags the import dropped, with why
    inferred: list[str] = field(default_factory=list)
    check: list[str] = field(default_factory=list)


def plan_server(source: Source, parsers: str) -> ServerPlan:
    """The server entry for one source; `parsers` is "add" or "keep"."""
    command, args, launcher_role = split_command(source.argv)
    mode = argv.value(args, "--disaggregation-mode")
    role = launcher_role or Role.UNIFIED
    if role is not Role.ROUTER and mode in ("prefill", "decode"):
        role = Role(mode)
    plan = ServerPlan(
        name=source.name_hint,
        role=role,
        command=command,
        args=args,
        env=dict(source.env),
        gpus=[],
        startup_budget_s=BUDGET_DEFAULT_S,
        source=source.label,
        inferred=list(source.read),
        check=list(source.check),
        container=source.container,
    )
    if launcher_role is None:
        plan.check.append(
            f"{command[0]} is not a known SGLang launcher: command = its program, args = the rest"
        )
    plan.inferred.append(f"command: {' '.join(command)}; args: {len(args)} words as started today")
    plan.inferred.append(f"role: {role.value}" + (f" (--disaggregation-mode {mode})" if mode else ""))
    for flag in argv.SECRET_FLAGS:
        if argv.last(args, flag) is not None:
            plan.arg_notes[flag] = "a secret: keep this file readable by the daemon only (chmod 600)"
    if role is Role.ROUTER:
        return plan
    model = argv.value(args, "--model-path") or ""
    if not model:
        plan.check.append("no --model-path in the args: SGLang needs one (check-config says so too)")
    _gpus(plan)
    _budget(plan, model)
    _parsers(plan, model, parsers)
    _metrics(plan)
    _health(plan)
    speculative = argv.value(plan.args, "--speculative-algorithm")
    if speculative:
        plan.inferred.append(
            f"speculative decoding ({speculative}): the spec_decode ladders apply (a kernel spin or a crash "
            "without another cause relaunches without --speculative-*)"
        )
    if plan.container is None:
        _hidden_paths(plan)
    return plan


def family_of(model: str) -> str | None:
    """The family name of `policies.parsers_table.FAMILIES` that `expected_parsers` matches for `model`."""
    for component in reversed([c for c in re.split(r"[/\\]", model.lower()) if c]):
        for pattern, family, _, _ in FAMILIES:
            if re.search(pattern, component):
                return family
    return None


def _int_flag(plan: ServerPlan, flag: str, default: int) -> int:
    raw = argv.value(plan.args, flag)
    if raw is None:
        return default
    try:
        return int(raw)
    except ValueError:
        plan.check.append(f"{flag} {raw} is not an integer; {default} assumed")
        return default


def _drop_flags(plan: ServerPlan, flags: list[str], why: str) -> None:
    ops = tuple(parse_op(f"remove {flag}") for flag in flags)
    new, diff = apply_rungs(plan.args, [Rung(ops)])
    plan.args = list(new)
    plan.removed += [f"{line[1:]}: {why}" for line in diff.lines()]


def _gpus(plan: ServerPlan) -> None:
    tp, pp, dp = (_int_flag(plan, f, 1) for f in ("--tp-size", "--pp-size", "--dp-size"))
    nnodes = max(1, _int_flag(plan, "--nnodes", 1))
    dp_attention = argv.present(plan.args, "--enable-dp-attention")
    need = max(1, tp * pp * (1 if dp_attention else dp) // nnodes)
    sizes = (
        f"tp {tp} × pp {pp}"
        + ("" if dp_attention else f" × dp {dp}")
        + (f" / {nnodes} nodes" if nnodes > 1 else "")
    )
    if nnodes > 1:
        plan.check.append(
            f"--nnodes {nnodes}: one node of a multi-node server; add a [group] section "
            "(docs/config.md, examples/group-2node-tp16.toml) on every node"
        )
    visible = plan.env.pop("CUDA_VISIBLE_DEVICES", None)
    if visible is not None:
        items = [x.strip() for x in visible.split(",") if x.strip()]
        if items and all(x.isdigit() for x in items):
            plan.gpus = [int(x) for x in items]
            plan.comments["gpus"] = "from CUDA_VISIBLE_DEVICES (the supervisor sets it from this list)"
            plan.inferred.append(f"gpus: {plan.gpus} from CUDA_VISIBLE_DEVICES ({sizes} needs {need})")
            if len(items) < need:
                plan.check.append(f"CUDA_VISIBLE_DEVICES lists {len(items)} GPUs; {sizes} needs {need}")
            return
        plan.check.append(
            f"CUDA_VISIBLE_DEVICES={visible} does not name GPUs by index: gpus must be their indices "
            "(nvidia-smi -L); the first ones were assumed"
        )
    base = _int_flag(plan, "--base-gpu-id", 0)
    step = _int_flag(plan, "--gpu-id-step", 1)
    plan.gpus = [base + i * step for i in range(need)]
    plan.comments["gpus"] = f"{sizes}" + (f" from --base-gpu-id {base}" if base else "")
    plan.inferred.append(f"gpus: {plan.gpus} ({sizes})")
    given = [f for f in ("--base-gpu-id", "--gpu-id-step") if argv.last(plan.args, f) is not None]
    if given:
        _drop_flags(plan, given, f"the supervisor makes GPUs {plan.gpus} visible, so SGLang counts from 0")


def model_size_b(model: str) -> float | None:
    """The largest parameter count (in billions) a model's name gives (`Qwen3-235B-A22B` → 235)."""
    tail = "/".join(model.lower().rstrip("/").split("/")[-2:])
    sizes = [float(m) for m in _SIZE.findall(tail)]
    return max(sizes) if sizes else None


def startup_budget(model: str) -> tuple[int, str]:
    """(startup_budget_s, why) for a model path (the rule in the module docstring)."""
    family = family_of(model)
    size = model_size_b(model)
    if family and family.startswith(BIG_MOE_FAMILIES) and "distill" not in family:
        return BUDGET_LARGE_S, f"{family}: a large MoE family; weights and DeepGEMM JIT take 20+ min cold"
    if size is not None and size >= 100:
        return BUDGET_LARGE_S, f"{size:g}B parameters: loading and JIT take 20+ min cold"
    if size is not None and size >= 30:
        return BUDGET_DEFAULT_S, f"{size:g}B parameters"
    if size is not None:
        return BUDGET_SMALL_S, f"{size:g}B parameters: a small model"
    return BUDGET_DEFAULT_S, "no size in the model's name: the default"


def _budget(plan: ServerPlan, model: str) -> None:
    plan.startup_budget_s, why = startup_budget(model)
    plan.comments["startup_budget_s"] = why
    plan.inferred.append(f"startup_budget_s: {plan.startup_budget_s} ({why})")


def _parsers(plan: ServerPlan, model: str, mode: str) -> None:
    expected = expected_parsers(model)
    if expected is None:
        plan.check.append(
            f"model family of {model or '(none)'} not recognised: parsers are not checked; if it calls tools, "
            "set --tool-call-parser/--reasoning-parser and [servers.probes] expected_*_parser"
        )
        return
    family = family_of(model)
    plan.expected = (expected.tool, expected.reasoning)
    wrong = parser_mismatches(plan.args, expected)
    names = f"tool {expected.tool or 'unset'}, reasoning {expected.reasoning or 'unset'}"
    if not wrong:
        plan.inferred.append(f"parsers: as the {family} family needs ({names})")
        return
    if mode == "keep":
        plan.check.append(
            f'{"; ".join(wrong)}: with parser_policy = "fix" the daemon launches with the family\'s parsers '
            "from the first launch (no restart after a full model load), but then runs other args than this "
            "config says; `import --parsers add` writes them"
        )
        return
    new, diff = build_argv(plan.args, {PARSER_KEY: 1}, {PARSER_KEY: parser_ladder(expected)})
    plan.args = list(new)
    why = f"the {family} family's parser"
    for flag, _ in (*diff.added, *((f, v) for f, _, v in diff.changed)):
        plan.arg_notes[flag] = f"set by import: {why}"
    plan.removed += [
        f"{line[1:]}: the {family} family needs it unset" for line in diff.lines() if line[0] == "-"
    ]
    plan.inferred.append(
        f"parsers of the {family} family ({names}): {', '.join(diff.lines())}. Without them the daemon would "
        'set them itself before the first launch (parser_policy = "fix"), no restart; in args, the config '
        "says what runs"
    )


def _metrics(plan: ServerPlan) -> None:
    if argv.present(plan.args, "--enable-metrics"):
        return
    plan.args.append("--enable-metrics")
    plan.arg_notes["--enable-metrics"] = "added by import: the progress lease reads /metrics"
    plan.inferred.append(
        "args: +--enable-metrics (decode wedges and collective hangs are found from /metrics)"
    )


def _health(plan: ServerPlan) -> None:
    raw = plan.env.get("SGLANG_HEALTH_CHECK_TIMEOUT", "").strip()
    if raw.isdigit() and int(raw) + HEALTH_PROBE_MARGIN_S > 35:
        plan.health_timeout_s = int(raw) + HEALTH_PROBE_MARGIN_S
        plan.inferred.append(
            f"probes.health_timeout_s: {plan.health_timeout_s} (SGLANG_HEALTH_CHECK_TIMEOUT {raw} + {HEALTH_PROBE_MARGIN_S})"
        )


def _hidden_paths(plan: ServerPlan) -> None:
    paths = [plan.command[0], *(argv.value(plan.args, f) or "" for f in _PATH_FLAGS)]
    hidden = [p for p in paths if p.startswith(_HIDDEN_HOMES)]
    if hidden:
        plan.check.append(
            f"{', '.join(hidden)}: under /root or /home, which the supervisor's unit hides (ProtectHome=yes); "
            "move them (e.g. /opt/sglang/.venv) or relax ProtectHome in a drop-in"
        )


def env_summary(env: dict[str, str]) -> str:
    """`NAME=value, …` with secret-looking values masked (`***`)."""
    return ", ".join(f"{k}={v}" for k, v in redact_env(env).items()) or "(none)"
