"""`sglang-supervisor drill`: a live fault on a simulated server, narrated from detection to recovery."""

from __future__ import annotations

import contextlib
import io
import tempfile
from pathlib import Path

import psutil
import pytest

from supervisor.training.demo import free_port, pick_sglang_port
from supervisor.training.drill import run_drill


def _drill_processes(root: Path) -> list[psutil.Process]:
    """Live processes of a drill's server whose simulator state lives under `root`."""
    found = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            env = proc.environ()
            ours = env.get("SGLSUP_SERVER", "").startswith("drill-")
            here = env.get("SGLANG_SIM_STATE_DIR", "").startswith(str(root))
            if ours and here and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
    return found


def test_zombie_drill_narrates_detection_and_recovery(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """zombie_after_cpp_abort: the drill tells the crash, its evidence, forensics and relaunch, exits 0, leaves nothing."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    out = io.StringIO()
    try:
        code = run_drill("zombie_after_cpp_abort", timeout_s=150.0, out=out, lead_in_s=0.5)
    finally:
        leftovers = _drill_processes(tmp_path)
        for proc in leftovers:
            with contextlib.suppress(psutil.Error):
                proc.kill()
    text = out.getvalue()
    assert code == 0, text
    assert "inject: POST" in text and "armed=True" in text
    assert "fault crash → action relaunch" in text, text
    assert "evidence" in text and "forensics bundle:" in text and "summary.json" in text
    assert "→ recovering (crash:" in text
    assert text.count("starting → serving") >= 2, "serving before the fault and again after the relaunch"
    assert "time to detect:" in text and "time back to serving:" in text
    assert "nothing left running" in text and "drill PASSED" in text
    assert "the fault comes in 0.5 s (--lead-in)" in text
    assert not leftovers, f"processes left behind: {[p.pid for p in leftovers]}"
    assert not list(tmp_path.glob("sglsup-drill-*")), "the drill removes its directory"


def test_drill_on_chosen_ports_keeps_its_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`--port`, `--sglang-port`, `--keep`: the status URL and watch command on the chosen port, the fault sent to
    the chosen SGLang port, and the state, journal and forensics still there afterwards, where it says."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    status, sglang = free_port(), pick_sglang_port(None, None)
    out = io.StringIO()
    try:
        code = run_drill(
            "zombie_after_cpp_abort", 150.0, out, port=status, sglang_port=sglang, keep=True, lead_in_s=0
        )
    finally:
        leftovers = _drill_processes(tmp_path)
        for proc in leftovers:
            with contextlib.suppress(psutil.Error):
                proc.kill()
    text = out.getvalue()
    assert code == 0, text
    url = f"http://127.0.0.1:{status}"
    assert f"status: {url}/status" in text
    assert f"follow along: sglang-supervisor status --watch --url {url}" in text
    assert f"inject: POST http://127.0.0.1:{sglang}/sim/fault" in text
    (kept,) = tmp_path.glob("sglsup-drill-*")
    assert f"kept: {kept}" in text
    assert (kept / "state" / "incidents.jsonl").read_text().strip(), "the incident journal stays"
    assert any((kept / "state" / "forensics").iterdir()), "the forensics bundle stays"
    assert not leftovers, f"processes left behind: {[p.pid for p in leftovers]}"
