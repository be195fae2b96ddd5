"""bench/gpu_check.py where no GPU is: it says so and exits 2; its team and configs are valid
and place as docs/gpus.md says (1 GPU: colocated, ipc; 4: apart, nccl)."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from flexmarl.placement.devices import Host
from flexmarl.placement.layout import _slot_sizes, place_gpus

BENCH = Path(__file__).resolve().parents[1] / "bench" / "gpu_check.py"


@pytest.fixture(scope="module")
def gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_on_a_cpu_machine_it_says_there_is_no_gpu_and_exits_2(gpu_check, capsys):
    assert gpu_check.main(["--json"]) == gpu_check.EXIT_CANNOT
    out, err = capsys.readouterr()
    last = json.loads(out.strip().splitlines()[-1])
    assert last["ok"] is False and "no GPU is visible" in last["reason"]
    assert "gpu_check: cannot run here: no GPU is visible" in err and "make TORCH=torch" in err


@pytest.mark.parametrize("gpus, transfer, shared", [(1, "ipc", True), (2, "ipc", True),
                                                    (4, "nccl", False), (8, "nccl", False)])
def test_the_check_places_the_default_team_on_the_gpus_there_are(gpu_check, tmp_path, gpus,
                                                                  transfer, shared):
    team = gpu_check.check_team("smollm2-135m")
    assert [a.model for a in team.agents] == ["smollm2-135m"] * 2
    config = gpu_check.check_config(3, gpus, str(tmp_path / "run"))
    assert (config.pipeline.mode, config.trainer.device, config.rollout.backend) == (
        "micro_batch", "cuda", "vllm")
    needs = {a.name: 1 for a in team.agents}
    placed = place_gpus(team, _slot_sizes(config.trainer_pool, needs),
                       [Host("local", tuple(range(gpus)))], rollout=config.rollout,
                       trainer_device=config.trainer.device, devices=config.devices,
                       trainer_pool=config.trainer_pool)
    assert placed.transfer == transfer and len(placed.devices.seats) == 4
    devices = [s.devices for s in placed.devices.seats.values()]
    assert (len(set(devices)) < 4) == shared


def test_peak_memory_is_read_from_the_gpus_cuda_names_matched_by_uuid(gpu_check):
    """CUDA orders devices fastest first (and after CUDA_VISIBLE_DEVICES, which may list UUIDs),
    NVML by PCI bus: the watch matches them by UUID (torch's lacks NVML's "GPU-" prefix)."""
    nvml = ["GPU-aaaa-0", "GPU-bbbb-1", "GPU-cccc-2"]
    assert gpu_check.nvml_indices(["cccc-2", "aaaa-0"], nvml) == [2, 0]
    assert gpu_check.nvml_indices([], nvml) == []
    with pytest.raises(ValueError, match="not among NVML's"):
        gpu_check.nvml_indices(["dddd-3"], nvml)
