"""bench/gpu_smoke.py where no GPU is: its CPU checks (the IPC handle through the runtime codec,
the planner's GPU choices, the versions and wheels) pass, its GPU checks say "no GPU", and it
exits 2 with one JSON line saying so. On a GPU machine the same with --cpu-only (the GPU checks
themselves are for the node: python bench/gpu_smoke.py)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch

SMOKE = Path(__file__).resolve().parents[1] / "bench" / "gpu_smoke.py"


def test_without_a_gpu_the_smoke_check_runs_its_cpu_checks_and_exits_2():
    extra = ["--cpu-only"] if torch.cuda.is_available() else []
    done = subprocess.run([sys.executable, str(SMOKE), "--json", *extra], capture_output=True,
                          text=True, timeout=240)
    assert done.returncode == 2, done.stdout + done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    checks = {c["name"]: c for c in out["checks"]}
    assert out["ok"] is False and out["gpu"] is False
    assert [checks[n]["status"] for n in ("versions", "codec", "planner")] == ["ok"] * 3, checks
    for name in ("trainer", "streams", "ipc", "rollout"):
        assert checks[name]["status"] == "skip"
        assert checks[name]["detail"].startswith("--cpu-only" if extra else "no GPU")
    assert "7B model 1.09 GB" in checks["planner"]["detail"]
    assert out["versions"]["torch"] == torch.__version__
    assert "CPU checks only" in done.stdout  # the table's verdict line
