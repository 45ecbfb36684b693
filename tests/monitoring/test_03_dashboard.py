"""Every panel of the packaged Grafana dashboard shows data from the run: its variables resolve as Grafana's
queries would, and each target, with the saved selection substituted, returns series from Prometheus."""

from __future__ import annotations

import json
import re
import time
from typing import Any

from tests.support.monitored import World

STEP_S = 2.0  # Grafana's $__interval for a panel about 1000 px wide over the run (minimum 1 s scrape)
RATE_INTERVAL = (
    "4s"  # $__rate_interval: max($__interval + scrape interval, 4 × scrape interval) at a 1 s scrape
)


def dashboard(world: World) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((world.bundle / "grafana-dashboard.json").read_text())
    return data


def label_values(world: World, query: str) -> list[str]:
    """A `label_values(metric{…}, label)` variable query, answered as Grafana asks Prometheus."""
    match = re.fullmatch(r"label_values\((.*), (\w+)\)", query)
    assert match is not None, query
    selector, label = match.groups()
    values: list[str] = world.prometheus.api(f"label/{label}/values", **{"match[]": selector})
    return values


def regex_of(values: list[str]) -> str:
    """How Grafana substitutes a multi-value variable into a Prometheus regex matcher: (a|b), escaped."""
    return "(" + "|".join(re.sub(r"([\\.+*?()|\[\]{}^$])", r"\\\\\1", v) for v in values) + ")"


def variables(world: World, board: dict[str, Any], span_s: float) -> dict[str, str]:
    """Every template variable's value as the saved dashboard opens: its query must offer values, and the saved
    selection ("All": the variable's allValue, else every value) is substituted, in the board's order."""
    found = {"__interval": f"{STEP_S:g}s", "__rate_interval": RATE_INTERVAL, "__range": f"{int(span_s)}s"}
    for var in board["templating"]["list"]:
        if var["type"] != "query":
            continue
        values = label_values(world, substitute(var["query"]["query"], found))
        assert values, f"variable ${var['name']} has no values"
        selected = var["current"]["value"]
        if selected == ["$__all"]:
            found[var["name"]] = var.get("allValue") or regex_of(values)
        else:
            found[var["name"]] = regex_of(selected)
    return found


def substitute(expr: str, values: dict[str, str]) -> str:
    """`$name`, `${name}` and `$__builtin` replaced, longest names first."""
    for name in sorted(values, key=len, reverse=True):
        expr = expr.replace("${" + name + "}", values[name]).replace("$" + name, values[name])
    return expr


def test_every_dashboard_panel_shows_series_from_the_run(world: World) -> None:
    """Each target of each panel, variables substituted, returns at least one sample over the run that is a
    number (NaN, what a quantile or a ratio of nothing gives, draws nothing)."""
    board = dashboard(world)
    end = time.time()
    values = variables(world, board, end - world.started)
    empty: list[str] = []
    for panel in board["panels"]:
        for target in panel["targets"]:
            expr = substitute(target["expr"], values)
            assert "$" not in expr, expr
            found = world.prometheus.query_range(expr, world.started, end, STEP_S)
            if not any(v != "NaN" for series in found for _, v in series["values"]):
                empty.append(f"panel {panel['id']} {panel['title']!r} {target['refId']}: {expr}")
    assert not empty, "panels with no data:\n" + "\n".join(empty)


def test_the_server_variable_lists_every_server_of_the_host(world: World) -> None:
    """The $server variable (as Grafana queries it for the $instance chosen) offers each configured server."""
    board = dashboard(world)
    query = next(v for v in board["templating"]["list"] if v["name"] == "server")["query"]["query"]
    instance = regex_of(label_values(world, "label_values(sglang_supervisor_build_info, instance)"))
    assert set(label_values(world, substitute(query, {"instance": instance}))) == set(
        world.host.server_names()
    )
