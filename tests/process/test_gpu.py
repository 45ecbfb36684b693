"""GPU release: device holders from /proc and fuser, sim and nvml backends, verify_free."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from supervisor.host import gpu, openfiles
from supervisor.host.gpu import GpuBackendUnavailable


def _nvml_works() -> bool:
    try:
        gpu.open_backend("nvml")
    except GpuBackendUnavailable:
        return False
    return True


NVML = _nvml_works()


def _device(tmp_path: Path, name: str = "nvidia0") -> Path:
    path = tmp_path / name
    path.write_bytes(b"stand-in GPU\n")
    return path


def _write_nvml(state: Path, pids: list[int], memory_used_mib: float) -> None:
    gpus = [
        {
            "index": 0,
            "utilization_gpu": 97,
            "power_w": 350.0,
            "power_limit_w": 700.0,
            "memory_used_mib": memory_used_mib,
            "memory_total_mib": 81920.0,
            "pids": pids,
            "xid_events": [{"xid": 79, "at": 1700000000.0}],
        }
    ]
    (state / "nvml.json").write_text(json.dumps({"updated_at": time.time(), "gpus": gpus}))


@pytest.mark.skipif(shutil.which("fuser") is None, reason="fuser (psmisc) is not installed")
def test_fuser_cross_check_agrees_with_proc_scan(tmp_path: Path, start_holder: Callable[..., int]) -> None:
    """fuser -a and the /proc fd scan both see the holder; the holder is tagged proc+fuser."""
    dev = _device(tmp_path)
    pid = start_holder(dev)
    fused = gpu.fuser_holders([dev])
    assert fused is not None and pid in fused[dev]
    holders = gpu.device_holders([dev])
    assert [(h.pid, h.source) for h in holders] == [(pid, "proc+fuser")]


def test_mapping_without_fd_is_found_only_with_maps(tmp_path: Path, start_holder: Callable[..., int]) -> None:
    """A process that mmapped a file and closed the fd is a holder when maps are scanned."""
    path = _device(tmp_path, "mapped")
    pid = start_holder(path, "--mmap")
    assert pid not in openfiles.open_holders([path])[path]
    assert pid in openfiles.open_holders([path], include_maps=True)[path]


def test_sim_backend_drops_dead_pids_and_gates_verify(
    tmp_path: Path, start_holder: Callable[..., int]
) -> None:
    """The sim backend reports live compute PIDs; verify_free waits for them and memory under threshold."""
    other = start_holder(_device(tmp_path, "unrelated"))
    backend = gpu.open_backend("sim", tmp_path)
    _write_nvml(tmp_path, [other, 999999], 60000.0)
    [sample] = backend.snapshot([0])
    assert sample.pids == (other,)
    assert sample.memory_used_mib == 60000.0 and sample.xid_events == (gpu.XidEvent(79, 1700000000.0),)
    busy = gpu.verify_free([0], [], backend, 500.0, deadline_s=0.2)
    assert not busy.ok
    assert f"GPU 0 has compute processes: pid {other}" in busy.reason and "60000 MiB" in busy.reason
    _write_nvml(tmp_path, [999999], 60000.0)
    free = gpu.verify_free([0], [], backend, 500.0, deadline_s=10)
    assert free.ok, free.reason
    assert free.samples[0].memory_used_mib == 0.0


def test_sim_backend_without_state_reports_idle_gpus(tmp_path: Path) -> None:
    """Without nvml.json (no simulated server ever ran there) the stand-in GPUs are free and idle."""
    samples = gpu.open_backend("sim", tmp_path).snapshot([0, 1])
    assert [(s.index, s.memory_used_mib, s.pids) for s in samples] == [(0, 0.0, ()), (1, 0.0, ())]
    assert gpu.verify_free([0], [], gpu.open_backend("sim", tmp_path), 500.0, deadline_s=0.1).ok


@pytest.mark.skipif(NVML, reason="NVML works here, so there is no unavailability to report")
def test_nvml_unavailable_has_a_clear_message() -> None:
    """Without the NVIDIA library or driver the nvml backend says why."""
    with pytest.raises(GpuBackendUnavailable, match="gpu backend 'nvml'"):
        gpu.open_backend("nvml")


@pytest.mark.skipif(not NVML, reason="needs an NVIDIA GPU with a loaded driver")
def test_nvml_snapshot_reads_the_real_card() -> None:
    """On a GPU host the nvml backend reports memory totals for GPU 0."""
    [sample] = gpu.open_backend("nvml").snapshot([0])
    assert sample.index == 0 and sample.memory_total_mib > 0
