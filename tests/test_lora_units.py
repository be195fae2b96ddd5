"""LoRA agents share their base's instances: which agents form a unit and how its instances are
sized (pure), the adapter-only sync (fake instances), and a worker whose adapters each have
their own version and gate (a real worker and torch engine, in process)."""
from __future__ import annotations

import asyncio

import pytest
from flexmarl import AgentSpec, LoraSpec, Team
from flexmarl.checks import ConfigError
from flexmarl.config.rollout import RolloutConfig
from flexmarl.placement.lora_units import lora_units
from flexmarl.models import build_model_dir, chat_prompt, load_tokenizer
from flexmarl.protocol import Generate, SamplingParams, WeightUpdate
from flexmarl.rollout.engine import EngineConfig
from flexmarl.rollout.torch_engine import TorchEngine
from flexmarl.rollout.worker import RolloutWorker
from flexmarl.tasks import addition_tasks
from flexmarl.weights.sync import WeightSync
from runtime.errors import RemoteError
from runtime.transport import connect

from tests.helpers.fake_instances import FakeInstance, publish, weights  # the fake instance connection
from tests.helpers.lora import ENGINE_SPEC, random_adapter  # adapters PEFT computes


async def workflow(ctx, task) -> None:
    pass


def team(*agents: AgentSpec) -> Team:
    return Team(name="t", agents=list(agents), workflow=workflow, tasks=addition_tasks(4))


def lora(rank: int = 8) -> LoraSpec:
    return LoraSpec(rank=rank, alpha=2 * rank)


# ----------------------------------------------------------------------------- the spec

@pytest.mark.parametrize("kwargs, match", [
    (dict(rank=0), "rank must be an int >= 1"),
    (dict(rank=1024), "largest rank vLLM serves"),
    (dict(alpha=0), "alpha must be > 0"),
    (dict(dropout=1.0), r"dropout must be in \[0, 1\)"),
    (dict(target_modules="q_proj"), "non-empty list of module names"),
    (dict(target_modules=()), "non-empty list of module names"),
    (dict(extra={"r": 4}), "cannot set \\['r'\\]"),
])
def test_a_bad_lora_spec_names_the_field(kwargs, match):
    with pytest.raises(ValueError, match=match):
        LoraSpec(**kwargs)


def test_lora_excludes_train_layers_and_a_frozen_agent():
    with pytest.raises(ValueError, match="lora and train_layers exclude each other"):
        AgentSpec(name="a", model="tiny", lora=lora(), train_layers=1)
    with pytest.raises(ValueError, match="frozen agent with a LoraSpec"):
        AgentSpec(name="a", model="tiny", lora=lora(), trainable=False)
    with pytest.raises(TypeError, match="must be a flexmarl.LoraSpec"):
        AgentSpec(name="a", model="tiny", lora={"rank": 8})
    assert LoraSpec.from_dict(lora(16).as_dict()) == lora(16)


# ----------------------------------------------------------------------------- units

def test_lora_agents_on_one_base_form_one_unit_sized_to_it():
    t = team(AgentSpec(name="solver", model="m", lora=lora(4)),
             AgentSpec(name="full", model="m"),
             AgentSpec(name="checker", model="m", lora=lora(20)),
             AgentSpec(name="other", model="n", lora=lora(8)))
    dirs = {"solver": "/m", "full": "/m", "checker": "/m", "other": "/n"}
    units = lora_units(t, dirs, RolloutConfig())
    assert units.members == {"solver+checker": ["solver", "checker"], "other": ["other"]}
    assert units.max_lora_rank == {"solver+checker": 32, "other": 8}  # vLLM's ranks: 20 -> 32
    assert units.max_loras == {"solver+checker": 2, "other": 1}
    assert [units.unit(a) for a in dirs] == ["solver+checker", "full", "solver+checker", "other"]
    assert units.adapters()["checker"] == ("solver+checker", lora(20).as_dict())
    assert lora_units(team(AgentSpec(name="a", model="m")), {"a": "/m"},
                      RolloutConfig()).members == {}


def test_units_that_instances_cannot_serve_are_config_errors():
    t = team(*[AgentSpec(name=f"a{i}", model="m", lora=lora(8 * (i + 1))) for i in range(3)])
    dirs = {f"a{i}": "/m" for i in range(3)}
    with pytest.raises(ConfigError, match=r"\['a2'\] have rank above rollout.max_lora_rank = 16"):
        lora_units(t, dirs, RolloutConfig(max_lora_rank=16))
    with pytest.raises(ConfigError, match="rollout.max_lora_rank must be one of"):
        lora_units(t, dirs, RolloutConfig(max_lora_rank=30))
    with pytest.raises(ConfigError, match="3 LoRA agents share .* rollout.max_loras = 2"):
        lora_units(t, dirs, RolloutConfig(max_loras=2))
    with pytest.raises(ConfigError, match=r"LoRA agents \['a1'\] cannot be time-shared"):
        lora_units(t, dirs, RolloutConfig(), time_shared=frozenset({"a1"}))
    assert lora_units(t, dirs, RolloutConfig(max_loras=4, max_lora_rank=64)).max_loras == \
        {"a0+a1+a2": 4}


# ----------------------------------------------------------------------------- sync

async def test_an_adapter_sync_sends_the_adapter_only_and_a_new_instance_loads_it(
        tmp_path, monkeypatch):
    monkeypatch.setenv("FLEXMARL_WEIGHTS_DIR", str(tmp_path))
    shared = [FakeInstance("i0"), FakeInstance("i1")]
    specs = {"solver": lora(4).as_dict(), "checker": lora(8).as_dict()}
    ws = WeightSync(["solver", "checker"], lambda agent: shared, {"solver": "/m", "checker": "/m"},
                    timeout_s=5.0, adapters=specs)
    assert ws.exported("solver") and ws.fresh("solver")
    report = await ws.sync("solver", 1, publish(1, weights(1.0), agent="solver",
                                                adapter="solver", lora=specs["solver"]))
    sent = shared[0].got[-1]
    assert (sent.adapter, sent.lora, sent.version) == ("solver", specs["solver"], 1)
    assert report.num_bytes == 7 * 4 and ws.versions == {"solver": 1, "checker": 0}
    assert not ws.fresh("solver") and ws.fresh("checker")  # version 0 is the base: nothing
    joining = FakeInstance("i2")
    await ws.load_into(joining, "solver")
    assert (joining.got[-1].adapter, joining.got[-1].force) == ("solver", True)
    assert joining.tensors["a.weight"].eq(1.0).all()  # read from the file the trainer wrote
    with pytest.raises(ValueError, match="LoRA agent: its adapter syncs staged"):
        await ws.sync("checker", 1, None)


# ----------------------------------------------------------------------------- worker

class HeldEngine(TorchEngine):
    """Holds the generations of adapters named in `hold` until released."""

    def __init__(self, config: EngineConfig) -> None:
        super().__init__(config)
        self.hold, self.release = set(), asyncio.Event()

    async def generate(self, prompt_ids, params, adapter=None):
        if adapter in self.hold:
            await self.release.wait()
        return await super().generate(prompt_ids, params, adapter)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    return str(build_model_dir("tiny", tmp_path_factory.mktemp("tiny") / "model", seed=0))


async def test_an_adapter_update_waits_for_its_own_requests_only(model_dir):
    """While one of solver's requests runs, an update of solver waits for it, and checker's
    requests go on; each reply carries its adapter's own version."""
    engine = HeldEngine(EngineConfig(model_dir=model_dir, adapters=("solver", "checker"),
                                     max_lora_rank=8, max_loras=2))
    engine.hold = {"solver"}
    prompt = chat_prompt(load_tokenizer(model_dir), "Compute 1+2.")
    params = SamplingParams(temperature=0, max_tokens=4)
    worker = RolloutWorker("r0", "inproc://lora-gate", engine)
    async with worker.serving(), connect(worker.address) as conn:
        running = asyncio.ensure_future(conn.request(
            Generate("s1", prompt_ids=prompt, params=params, adapter="solver")))
        while not worker._adapter_running["solver"]:
            await asyncio.sleep(0.01)
        update = asyncio.ensure_future(conn.request(WeightUpdate(
            1, random_adapter(model_dir, 1)[1], adapter="solver", lora=ENGINE_SPEC.as_dict())))
        other = await asyncio.wait_for(conn.request(
            Generate("c1", prompt_ids=prompt, params=params, adapter="checker")), 60)
        assert other.version == 0 and not update.done()  # checker was not held up
        engine.release.set()
        assert (await running).version == 0  # started before the update: the old adapter
        assert (await update).version == 1
        after = await conn.request(Generate("s2", prompt_ids=prompt, params=params,
                                            adapter="solver"))
        assert after.version == 1 and worker.adapter_versions == {"solver": 1, "checker": 0}
        with pytest.raises(RemoteError, match="serves no LoRA adapter 'judge'"):
            await conn.request(Generate("j", prompt_ids=prompt, params=params, adapter="judge"))
        with pytest.raises(RemoteError, match="stale weight update: adapter solver version 1"):
            await conn.request(WeightUpdate(1, {}, adapter="solver", lora=ENGINE_SPEC.as_dict()))
