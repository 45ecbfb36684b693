"""The series of a real run replayed through `promtool test rules` with the packaged rules, unchanged, to show what
a run of minutes is too short to show: an alert over a window of events (`increase(…[30m])` and its young-daemon
clause) resolves once its window has passed with no new event.

What is taken from the run: every series of each metric the alert's rule reads, as the run's Prometheus holds it,
one value a second from `start` (a range query, step 1 s; `_` where it had none). What is added, each named here:

- time moves so that `start` is promtool's 0; the one gauge that holds a Unix time
  (`sglang_supervisor_start_time_seconds`) moves with it;
- after the last second recorded every series keeps its last value for the rule's window and a few evaluations
  more: the daemon runs on and nothing more happens (the live test checks that the cause's counter stayed flat
  since the recovery).

promtool evaluates the rules at the packaged `prometheus.yml`'s evaluation interval (15 s), as production does.
The replay asserts the alert fires at the last second recorded (as it did live) and is gone two evaluations after
its window has passed.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from tests.support.prometheus import Prometheus
from tests.support.tools import ensure_promtool

TIME_GAUGES = ("sglang_supervisor_start_time_seconds",)
_METRIC = re.compile(r"\bsglang_supervisor_\w+")
_WINDOW = re.compile(r"\[(\d+)m\]")


def rule(rules: Path, alert: str) -> dict[str, Any]:
    """The rule of `alert` in a rule file."""
    groups = yaml.safe_load(rules.read_text())["groups"]
    return next(r for g in groups for r in g["rules"] if r.get("alert") == alert)


def window_s(expr: str) -> int:
    """The longest range window of an expression, in seconds."""
    return max(int(m) * 60 for m in _WINDOW.findall(expr))


def _runs(values: list[str]) -> str:
    """promtool's expanding notation: `v` repeated k times is `vx(k-1)`; a missing sample is `_`."""
    out: list[str] = []
    i = 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and values[j + 1] == values[i]:
            j += 1
        k = j - i + 1
        if values[i] == "_":
            out += ["_"] * k
        else:
            out.append(values[i] if k == 1 else f"{values[i]}x{k - 1}")
        i = j + 1
    return " ".join(out)


def _selector(metric: Mapping[str, str]) -> str:
    labels = {k: v for k, v in metric.items() if k != "__name__"}
    inner = ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return f"{metric['__name__']}{{{inner}}}"


def recorded_series(
    prometheus: Prometheus, metrics: set[str], start: float, end: float, extend_s: int
) -> list[dict[str, str]]:
    """promtool `input_series` of every series of `metrics` from `start` to `end`, extended flat by `extend_s`."""
    steps = int(end - start) + 1
    series: list[dict[str, str]] = []
    for name in sorted(metrics):
        for found in prometheus.query_range(name, start, start + steps - 1, 1):
            values = ["_"] * steps
            for t, v in found["values"]:
                value = float(v) - start if name in TIME_GAUGES else float(v)
                values[round(float(t) - start)] = f"{value:.3f}".rstrip("0").rstrip(".")
            known = [v for v in values if v != "_"]
            values += [known[-1]] * extend_s
            series.append({"series": _selector(found["metric"]), "values": _runs(values)})
    return series


def evaluation_s(scrape_example: Path) -> int:
    """The evaluation interval of a Prometheus configuration, in seconds."""
    value = str(yaml.safe_load(scrape_example.read_text())["global"]["evaluation_interval"])
    match = re.fullmatch(r"(\d+)([sm])", value)
    assert match is not None, value
    return int(match.group(1)) * (60 if match.group(2) == "m" else 1)


def replay(
    prometheus: Prometheus,
    bundle: Path,
    alert: str,
    labels: Mapping[str, str],
    start: float,
    end: float,
    workdir: Path,
) -> str:
    """Replay the run from `start` to `end` through the packaged rules and evaluation interval of `bundle` (what
    `files monitoring` wrote); promtool's report. Fails unless `alert` with `labels` fires at `end` and has
    resolved two evaluations after its window has passed."""
    rules = bundle / "alerts.yaml"
    expr = str(rule(rules, alert)["expr"])
    window, every = window_s(expr), evaluation_s(bundle / "prometheus.yml")
    last = int(end - start)
    inputs = recorded_series(prometheus, set(_METRIC.findall(expr)), start, end, window + 3 * every)
    matchers = ", ".join(
        [f'alertname="{alert}"', 'alertstate="firing"', *(f'{k}="{v}"' for k, v in labels.items())]
    )
    firing = f"count(ALERTS{{{matchers}}})"
    test = {
        "rule_files": [str(rules)],
        "evaluation_interval": f"{every}s",
        "tests": [
            {
                "name": f"{alert} replayed from the run",
                "interval": "1s",
                "input_series": inputs,
                "promql_expr_test": [
                    {"expr": firing, "eval_time": f"{last}s", "exp_samples": [{"labels": "{}", "value": 1}]},
                    {"expr": firing, "eval_time": f"{last + window + 2 * every}s", "exp_samples": []},
                ],
            }
        ],
    }
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / f"{alert}.replay.yaml"
    path.write_text(yaml.safe_dump(test, sort_keys=False, width=1 << 16))
    result = subprocess.run(
        [str(ensure_promtool()), "test", "rules", str(path)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    report = result.stdout + result.stderr
    assert result.returncode == 0, f"{alert} replayed from the run ({path}):\n{report[-4000:]}"
    return report
