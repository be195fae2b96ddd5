"""devices.cores: rollout and training on a CPU machine's cores, split between the roles or shared
by both phases (flexmarl.placement.cores, flexmarl.sim.cpu_cores, flexmarl.launch.build's
resolve_cores, flexmarl.launch.workers' pinning), and one real run with shared cores."""
from __future__ import annotations

import json
import os
import struct

import pytest

from flexmarl.checks import ConfigError
from flexmarl.config.load import load_config
from flexmarl.sim.cpu_cores import (AgentWork, choose, load_prices, params_b, pick, price,
                                    trained_share)

# ----------------------------------------------------------------------------- pure: pinning


def test_shared_cores_give_both_roles_every_core_and_each_instance_one(monkeypatch):
    from flexmarl import checks
    from flexmarl.placement.cores import cores_choosable, instance_core, role_cpus
    monkeypatch.setattr(checks, "available_cpus", lambda: [0, 1, 2, 3])
    assert role_cpus("auto", "auto", "cpu", shared=True) == ((0, 1, 2, 3), (0, 1, 2, 3))
    assert role_cpus("auto", "auto", "cpu") == ((0, 1), (2, 3))  # split, as before
    assert role_cpus("0", "auto", "cpu", shared=True) == ((0,), (1, 2, 3))  # explicit: kept
    assert role_cpus("auto", "auto", "cuda", shared=True) == ((), ())
    # An agent's instances spread over every core before any core gets a second.
    taken: list[int] = []
    for _ in range(6):
        taken.append(instance_core((0, 1, 2, 3), taken))
    assert taken == [0, 1, 2, 3, 0, 1]
    assert cores_choosable("auto", "auto", "cpu", remote=False)
    assert not cores_choosable("auto", "auto", "cpu", remote=True)      # nodes pin their own
    assert not cores_choosable("auto", "auto", "cuda", remote=False)
    assert not cores_choosable("0-1", "auto", "cpu", remote=False)      # the user pinned
    monkeypatch.setattr(checks, "available_cpus", lambda: [0])
    assert not cores_choosable("auto", "auto", "cpu", remote=False)     # one core: nothing


def test_devices_cores_is_checked():
    assert load_config(overrides=["devices.cores=shared"]).devices.cores == "shared"
    with pytest.raises(ConfigError, match="devices.cores"):
        load_config(overrides=["devices.cores=half"])


def _workers(tmp_path, shared: bool, cpus=(0, 1)):
    from flexmarl.launch.workers import WorkerSettings, Workers
    c = load_config(overrides=["rollout.backend=torch"])
    settings = WorkerSettings(c.rollout, c.trainer, c.trainer_pool, c.devices, c.transport,
                              cpus=(cpus, cpus), shared_cores=shared)

    class Sup:  # Workers only builds specs here; nothing starts
        remote = False
    return Workers(Sup(), settings, {"solver": "m", "checker": "m"}, str(tmp_path), [1, 1])


def test_shared_workers_pin_each_instance_to_one_core_and_trainers_to_all(tmp_path):
    w = _workers(tmp_path, shared=True)
    specs = [w.rollout(a) for a in ("solver", "solver", "checker", "checker")]
    assert [s.cpus for s in specs] == [(0,), (1,), (0,), (1,)]
    assert [s.env["VLLM_CPU_OMP_THREADS_BIND"] for s in specs] == ["0", "1", "0", "1"]
    # A replacement takes the dead instance's core, whatever the others hold; a second attempt
    # (the first failed to start) finds the same core, and a new instance of the agent fills
    # the core the dead one left, not a core already taken twice.
    again = w.rollout("solver", replaces=specs[1].name)
    assert again.cpus == (1,) and again.name not in {s.name for s in specs}
    assert w.rollout("solver", replaces=specs[1].name).cpus == (1,)
    [rank] = w.trainer_slot(0)
    assert rank.cpus == (0, 1) and rank.env["OMP_WAIT_POLICY"] == "PASSIVE"
    split = _workers(tmp_path, shared=False, cpus=(0,))
    assert split.rollout("solver").cpus == (0,) and split.trainer_slot(0)[0].env == {}


# ----------------------------------------------------------------------------- pure: pricing

SMOL = dict(params_b=0.135, samples=32, prompts=4, response_tokens=11, trained=0.2)


def test_the_prices_follow_the_formulas_of_the_module_docstring():
    p = load_prices()
    [a] = agents = [AgentWork("solver", **SMOL)]
    gen = a.params_b * (4 * p.prompt_tokens * p.prefill_s + 32 * 11 * p.decode_s)
    train = a.params_b * (4 * p.prompt_tokens + 32 * 11) * p.train_s * (1 / 3 + 2 / 3 * 0.2)
    prices = price(agents, 2, 10, p)
    # Split on 2 cores: one rollout core, one trainer core, the phases one after the other.
    assert prices["split"].step_s == pytest.approx(gen + train + p.step_overhead_s)
    # Shared: both phases on both cores, the trainer on 2 threads.
    shared = ((gen + train * 2 / 2 ** p.train_thread_exponent) / 2
              / p.shared_efficiency + p.step_overhead_s + 0.135 * p.instance_sync_s)
    assert prices["shared"].step_s == pytest.approx(shared)
    for x in prices.values():
        assert x.run_s == pytest.approx(x.startup_s + 10 * x.step_s)
    assert pick(prices)[0] == "shared"


def test_auto_weighs_the_start_up_against_the_steps_and_respects_memory():
    p = load_prices()
    smol = [AgentWork(n, **SMOL) for n in ("solver", "checker")]
    assert pick(price(smol, 2, 20, p))[0] == "shared"  # the default team: shared on 2 cores
    # A model too small for its steps to matter: the extra engines' start-up decides.
    tiny = [AgentWork(n, 1e-4, 4, 2, 4) for n in ("solver", "checker")]
    best, why = pick(price(tiny, 2, 3, p))
    assert best == "split" and "priced run" in why
    # One engine per core per agent: past memory_share of the memory, refused.
    big = [AgentWork("solver", 7.0, 32, 4, 100)]
    prices = price(big, 16, 20, p, memory_bytes=64 * 2**30)
    assert prices["shared"].refused and pick(prices)[0] == "split"
    assert "GiB" in pick(prices)[1]
    # A frozen agent's engines count too (it generates, it never trains): a small learner's 64
    # engines (about 96 GiB with their processes) fit in half of 256 GiB, not beside a 1.7B
    # judge's 64 more.
    judge = [AgentWork("learner", 0.135, 32, 4, 11, 0.2),
             AgentWork("judge", 1.7, 32, 4, 11, trains=False)]
    assert price(judge, 64, 20, p, memory_bytes=256 * 2**30)["shared"].refused
    assert not price(judge[:1], 64, 20, p, memory_bytes=256 * 2**30)["shared"].refused
    frozen_only = price([AgentWork("j", 0.135, 32, 4, 11, trains=False)], 2, 5, p)
    assert frozen_only["split"].step_s == pytest.approx(
        0.135 * (4 * p.prompt_tokens * p.prefill_s + 32 * 11 * p.decode_s) + p.step_overhead_s)
    with pytest.raises(ValueError, match="2\\+ cores"):
        price(smol, 1, 3, p)


def _safetensors(path, shapes: dict[str, list[int]]) -> None:
    header = {k: {"dtype": "F32", "shape": v, "data_offsets": [0, 0]} for k, v in shapes.items()}
    header["__metadata__"] = {"format": "pt"}
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw)


def test_a_models_size_and_trained_share_come_from_its_directory(tmp_path):
    _safetensors(tmp_path / "model-1.safetensors", {"a": [1000, 1000], "b": [10]})
    _safetensors(tmp_path / "model-2.safetensors", {"c": [500, 2]})
    (tmp_path / "config.json").write_text(json.dumps({"num_hidden_layers": 30}))
    assert params_b(str(tmp_path)) == pytest.approx(1_001_010 / 1e9)
    assert trained_share(str(tmp_path), 6) == pytest.approx(0.2)
    assert trained_share(str(tmp_path), 0) == 1.0
    with pytest.raises(ValueError, match="no safetensors"):
        params_b(str(tmp_path / "nothing"))


# ----------------------------------------------------------------------------- resolve_cores

def _resolve(monkeypatch, tmp_path, *overrides, cores=(0, 1)):
    from flexmarl import checks
    from flexmarl.launch import build
    from tests.helpers.teams import duo
    monkeypatch.setattr(checks, "available_cpus", lambda: list(cores))
    monkeypatch.setattr(build, "available_cpus", lambda: list(cores))
    _safetensors(tmp_path / "model.safetensors", {"w": [135_000_000]})
    (tmp_path / "config.json").write_text(json.dumps({"num_hidden_layers": 30}))
    team = duo(str(tmp_path))
    config = load_config(overrides=["rollout.backend=torch", *overrides])
    return build.resolve_cores(config, team, {"solver": str(tmp_path), "checker": str(tmp_path)})


def test_resolve_cores_sets_one_instance_per_core_under_shared(monkeypatch, tmp_path):
    shared = _resolve(monkeypatch, tmp_path, "devices.cores=shared", cores=(0, 1, 2))
    assert shared.devices.cores == "shared" and shared.rollout.instances_per_agent == 3
    kept = _resolve(monkeypatch, tmp_path, "devices.cores=shared",
                    "rollout.instances_per_agent=2", cores=(0, 1, 2))
    assert kept.rollout.instances_per_agent == 2  # an explicit count is the user's
    split = _resolve(monkeypatch, tmp_path, "devices.cores=split")
    assert (split.devices.cores, split.rollout.instances_per_agent) == ("split", 1)
    # Where the choice is not this machine's cores to make, "split": pins as the user said.
    for extra in (["rollout.cpus=0"], ["trainer.device=cuda"]):
        assert _resolve(monkeypatch, tmp_path, "devices.cores=shared", *extra).devices.cores \
            == "split"
    assert _resolve(monkeypatch, tmp_path, cores=(0,)).devices.cores == "split"


def test_auto_prices_the_team_and_keeps_split_for_what_it_does_not_price(monkeypatch, tmp_path):
    # A SmolLM2-sized duo for 20 steps on 2 cores: shared.
    auto = _resolve(monkeypatch, tmp_path, "run.steps=20")
    assert auto.devices.cores == "shared" and auto.rollout.instances_per_agent == 2
    # The same priced directly, with the reason.
    from tests.helpers.teams import duo
    config = load_config(overrides=["run.steps=20"])
    best, why = choose(duo(str(tmp_path)), config,
                       {"solver": str(tmp_path), "checker": str(tmp_path)}, 2)
    assert best == "shared" and "shared against" in why
    # Not priced: the vLLM engine, time-shared agents.
    assert _resolve(monkeypatch, tmp_path, "rollout.backend=vllm").devices.cores == "split"
    assert _resolve(monkeypatch, tmp_path, "devices.placement=time_shared").devices.cores \
        == "split"


# ----------------------------------------------------------------------------- a real run

@pytest.mark.slow
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="shared cores need 2+ cores")
async def test_a_run_on_shared_cores_trains_every_agent_at_zero_staleness_on_every_core(
        tiny_model_dir, tmp_path, no_leftover_children):
    """devices.cores = "shared" for real: each agent gets one instance per core (both serve
    calls), both agents train every step on samples of their current version."""
    from tests.helpers.runs import config, hist, run
    from tests.helpers.teams import duo
    cores = len(os.sched_getaffinity(0))
    cfg = config(tmp_path, "micro_batch", "devices.cores=shared", "observe.report=false")
    result = await run(duo(tiny_model_dir), cfg)
    assert len(result.metrics) == 3
    for m in result.metrics:
        for name in ("solver", "checker"):
            a = m["agents"][name]
            assert a["instances"] == cores and a["trained_samples"] > 0
            assert hist(m, name) == {0: a["trained_samples"]}  # zero staleness
    served = {k for m in result.metrics for k, v in m["instance_tokens"].items() if v > 0}
    assert len(served) == 2 * cores  # every instance of both agents answered calls
