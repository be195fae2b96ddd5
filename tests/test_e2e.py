"""End to end: `train()` runs a two-agent team for 2 steps on real processes and engines."""
from __future__ import annotations

import pytest
import torch

from flexmarl.config.load import load_config
from flexmarl.observe.rundir import RunDir, read_metrics
from flexmarl.launch.run import train
from tests.helpers.numerics import RATIO_ATOL
from tests.helpers.teams import duo

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("backend", ["torch", pytest.param("vllm", marks=pytest.mark.vllm)])
async def test_two_steps_end_to_end(backend, tiny_model_dir, tmp_path, no_leftover_children):
    # The torch run also checks two trainer features end to end: KL to the initial weights
    # (trainer.kl_coef) and scoring under each sample's own sampling settings (the solver
    # samples at temperature 0.7 with top-k 20 and top-p 0.9).
    extra = ["trainer.kl_coef=0.05"] if backend == "torch" else []
    sampling = dict(temperature=0.7, top_k=20, top_p=0.9) if backend == "torch" else {}
    config = load_config(overrides=[
        f"run.dir={tmp_path / 'run'}", "run.steps=2", f"rollout.backend={backend}",
        "pipeline.tasks_per_step=3", "pipeline.trajectories_per_task=2",
        "pipeline.micro_batch_groups=2", "trainer.lr=1e-3", "rollout.kv_cache_bytes=33554432",
        *extra])
    run_dir = RunDir.create(config)
    # The vLLM run trains only the solver's last block: its syncs send only that block (and
    # the final norm), reloaded in place into vLLM beside the frozen rest.
    layers = 1 if backend == "vllm" else None
    result = await train(duo(tiny_model_dir, train_layers=layers, **sampling), config,
                         run_dir=run_dir, progress=False)

    assert [m["step"] for m in result.metrics] == [0, 1]
    assert read_metrics(run_dir.path / "metrics.jsonl") == result.metrics
    for m in result.metrics:
        solver, checker = m["agents"]["solver"], m["agents"]["checker"]
        assert checker["samples"] == 3 * 2 and solver["samples"] == 3 * 2 * 2
        assert 0.0 <= m["team_reward"] <= 1.0 and m["rollout_s"] > 0
        for a in (solver, checker):
            assert a["staleness"] in (None, 0.0)  # micro_batch (the default): zero staleness
    # Each agent stepped once per step (its groups carry a signal) and serves that version.
    for name in ("solver", "checker"):
        versions = [m["agents"][name]["version"] for m in result.metrics]
        assert versions == [1, 2], (name, versions)
        assert all(m["agents"][name]["trained_samples"] > 0 for m in result.metrics)
        assert all(m["agents"][name]["sync_bytes"] > 0 for m in result.metrics)
        assert result.versions[name] == versions[-1]
        assert (result.checkpoints[name] / "model.safetensors").is_file()
    assert (run_dir.path / "config.toml").is_file() or (run_dir.path / "config.json").is_file()
    for m in result.metrics:
        metrics = m["agents"]["solver"]["train_metrics"]
        assert metrics["entropy"] > 0
        # On-policy within a global batch: scored as sampled, the ratio is 1 (the trainer and
        # the torch engine compute in float32 in different processes: RATIO_ATOL).
        if backend == "torch":
            assert abs(metrics["ratio_mean"] - 1.0) < RATIO_ATOL and metrics["clip_frac"] == 0
    if backend == "vllm":
        for m in result.metrics:
            solver, checker = m["agents"]["solver"], m["agents"]["checker"]
            assert 0 < solver["sync_bytes"] < checker["sync_bytes"] / 2
        # The solver's checkpoint is a whole model: its frozen first block is the base's, its
        # trained last block is not.
        from transformers import AutoModelForCausalLM
        saved = AutoModelForCausalLM.from_pretrained(result.checkpoints["solver"]).state_dict()
        base = AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()
        assert saved.keys() == base.keys()
        frozen = [k for k in base if k.startswith("model.layers.0.")]
        trained = [k for k in base if k.startswith("model.layers.1.")]
        assert frozen and all(torch.equal(saved[k], base[k]) for k in frozen)
        assert any(not torch.equal(saved[k], base[k]) for k in trained)
    if backend == "torch":
        kls = [m["agents"]["solver"]["train_metrics"]["kl"] for m in result.metrics]
        assert kls[0] < 1e-6 < kls[1], kls  # the reference is the initial weights
