"""`sglang-supervisor drill` and `demo` on the command line: what is a drill, the list, ports and directories."""

from __future__ import annotations

import io
import socket
import tempfile
import tomllib
from pathlib import Path

import pytest

from supervisor.cli import main
from supervisor.training.demo import free_port, pick_sglang_port, workdir
from supervisor.training.drill import run_drill
from supervisor.training.scenarios import DRILLS


def test_unknown_scenario_exits_2_listing_the_drills() -> None:
    """An unknown scenario exits 2 with a message naming every valid drill."""
    out = io.StringIO()
    assert run_drill("no_such_fault", out=out) == 2
    text = out.getvalue()
    assert "'no_such_fault' is not a drill: unknown scenario" in text
    assert all(name in text for name in DRILLS)


def test_launch_time_scenario_points_to_the_demo() -> None:
    """A catalog fault that only fires at launch is not a drill: exit 2 and the demo command to use instead."""
    out = io.StringIO()
    assert run_drill("slow_startup_deepgemm", out=out) == 2
    assert "sglang-supervisor demo --scenario slow_startup_deepgemm" in out.getvalue()


def test_drill_list_prints_one_line_per_scenario(capsys: pytest.CaptureFixture[str]) -> None:
    """`drill --list`: exit 0, one line per drill, each `name — the fault → what the supervisor does`."""
    assert main(["drill", "--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == sorted(DRILLS)
    assert all(" — " in line and " → " in line for line in lines)


def test_drill_help_lists_the_scenarios(capsys: pytest.CaptureFixture[str]) -> None:
    """`drill --help` names every scenario and the new options."""
    with pytest.raises(SystemExit) as exited:
        main(["drill", "--help"])
    assert exited.value.code == 0
    text = capsys.readouterr().out
    assert all(name in text for name in DRILLS)
    assert all(opt in text for opt in ("--list", "--port", "--sglang-port", "--keep", "--lead-in"))


def test_drill_without_a_scenario_lists_them_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    """`drill` alone is a usage error that shows what can be drilled."""
    assert main(["drill"]) == 2
    err = capsys.readouterr().err
    assert all(name in err for name in DRILLS)


def test_a_taken_port_asked_for_is_refused_before_anything_starts() -> None:
    """An explicit `--port` or `--sglang-port` that is in use: exit 2 naming it, nothing started."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        port = busy.getsockname()[1]
        for kwargs in ({"port": port}, {"sglang_port": port}):
            out = io.StringIO()
            assert run_drill("zombie_after_cpp_abort", out=out, **kwargs) == 2
            assert f"{port}" in out.getvalue() and "in use" in out.getvalue()
        assert main(["demo", "--sglang-port", str(port)]) == 2


def test_demo_config_takes_both_ports(capsys: pytest.CaptureFixture[str]) -> None:
    """`demo --print-config --port P --sglang-port Q`: the status endpoint on P, SGLang on Q (its rank 0 on Q+2)."""
    status, sglang = free_port(), pick_sglang_port(None, None)
    assert main(["demo", "--print-config", "--port", str(status), "--sglang-port", str(sglang)]) == 0
    config = tomllib.loads(capsys.readouterr().out)
    assert config["supervisor"]["http"]["port"] == status
    server = config["servers"][0]
    assert server["args"][server["args"].index("--port") + 1] == str(sglang)
    assert server["ports"] == [sglang + 2]


def test_workdir_is_removed_unless_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The demo's and drill's directory vanishes on exit; with keep it stays."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with workdir("sglsup-x-", keep=False) as gone:
        (gone / "state").mkdir()
    with workdir("sglsup-x-", keep=True) as kept:
        (kept / "state").mkdir()
    assert not gone.exists() and (kept / "state").is_dir()
