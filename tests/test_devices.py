"""The device placement planner (flexmarl.placement.devices): pure logic, no GPU needed. The
tests pass on a GPU machine too: where they ask about "this machine", they set its GPUs."""
from __future__ import annotations

import asyncio
from collections import Counter

import pytest
from hypothesis import given, settings, strategies as st

from flexmarl.checks import ConfigError
from flexmarl.config.sections import DevicesConfig, parse_gpus
from flexmarl.placement.devices import Ask, DevicePlacement, Host, PlacementError, place_devices


def instances(agent: str, n: int, tp: int = 1, start: int = 0) -> list[Ask]:
    return [Ask(f"rollout-{start + i}", "rollout", tp, label=agent) for i in range(n)]


def slot(k: int, ranks: int) -> list[Ask]:
    return [Ask(f"trainer-{k}-{r}", "trainer", group=f"trainer-{k}") for r in range(ranks)]


def check_valid(plan: DevicePlacement, asks: list[Ask]) -> None:
    """Every ask seated with its count of GPUs, on a host of its role; no GPU shared (with
    colocate: shares of at most 1 per GPU, and a slot's ranks on distinct GPUs)."""
    hosts = {h.name: h for h in plan.hosts}
    assert set(plan.seats) == {a.worker for a in asks}
    used, ranks = Counter(), Counter()
    for ask in asks:
        seat = plan.seats[ask.worker]
        assert len(seat.devices) == ask.gpus == len(set(seat.devices))
        assert hosts[seat.host].serves(ask.role)
        assert set(seat.devices) <= set(hosts[seat.host].gpus)
        for d in seat.devices:
            used[(seat.host, d)] += ask.memory if plan.colocate else 1.0
            if ask.group:
                ranks[(ask.group, seat.host, d)] += 1
    assert max(used.values(), default=1) <= 1 + 1e-9
    assert max(ranks.values(), default=1) == 1


def test_the_default_team_gets_one_gpu_per_worker():
    asks = instances("solver", 1) + instances("checker", 1, start=1) + slot(0, 1) + slot(1, 1)
    plan = place_devices([Host("local", (0, 1, 2, 3))], asks)
    check_valid(plan, asks)
    assert sorted(d for s in plan.seats.values() for d in s.devices) == [0, 1, 2, 3]
    assert plan.env("rollout-0") == {"CUDA_VISIBLE_DEVICES": str(plan.seats["rollout-0"].devices[0])}
    assert plan.env("a-cpu-worker") == {}  # no seat: nothing set, it runs on CPU
    assert list(plan.seats) == [a.worker for a in asks]  # the table reads like the config


def test_tensor_parallel_instances_and_whole_slots_stay_on_one_host():
    hosts = [Host("a", tuple(range(8))), Host("b", tuple(range(8)))]
    asks = (instances("big", 2, tp=4) + instances("small", 3, start=2) + slot(0, 4) +
            slot(1, 1))
    plan = place_devices(hosts, asks)
    check_valid(plan, asks)
    slot0 = {plan.seats[f"trainer-0-{r}"].host for r in range(4)}
    assert len(slot0) == 1
    big = plan.seats["rollout-0"]
    assert big.devices == tuple(range(big.devices[0], big.devices[0] + 4))  # contiguous
    assert "CUDA_VISIBLE_DEVICES" in plan.env("rollout-1")
    assert len(plan.env("rollout-1")["CUDA_VISIBLE_DEVICES"].split(",")) == 4


def test_nodes_host_only_their_role():
    hosts = [Host("r1", tuple(range(8)), ("rollout",)), Host("r2", tuple(range(8)), ("rollout",)),
             Host("t1", tuple(range(8)), ("trainer",))]
    asks = instances("a", 4, tp=2) + instances("b", 8, start=4) + slot(0, 4) + slot(1, 4)
    plan = place_devices(hosts, asks)
    check_valid(plan, asks)
    assert {plan.host(a.worker) for a in asks if a.role == "trainer"} == {"t1"}
    assert {plan.host(a.worker) for a in asks if a.role == "rollout"} == {"r1", "r2"}


def test_a_slot_too_big_for_one_host_spreads_its_ranks():
    hosts = [Host("t1", (0, 1, 2, 3), ("trainer",)), Host("t2", (0, 1, 2, 3), ("trainer",)),
             Host("r", (0, 1), ("rollout",))]
    asks = instances("a", 2) + slot(0, 6)
    plan = place_devices(hosts, asks)
    check_valid(plan, asks)
    assert Counter(plan.host(f"trainer-0-{r}") for r in range(6)) == {"t1": 3, "t2": 3}


def test_not_enough_gpus_is_one_error_listing_what_was_asked_and_what_exists():
    asks = instances("a", 2, tp=2) + instances("b", 2, start=2) + slot(0, 2) + slot(1, 2)
    with pytest.raises(PlacementError) as err:
        place_devices([Host("local", tuple(range(8)))], asks)
    msg = str(err.value)
    assert "asks for 10 GPUs" in msg and "4 rollout instances x tensor_parallel_size 1/2 = 6" in msg
    assert "2 trainer slots with 4 ranks = 4" in msg and "8 exist (local (any): 8 (0-7))" in msg
    assert "devices.colocate = true" in msg and "rollout.tensor_parallel_size" in msg
    assert isinstance(err.value, ConfigError)  # the CLI reports it as a config error


def test_an_instance_whose_gpus_are_on_no_single_host_is_named():
    hosts = [Host("a", (0, 1, 2)), Host("b", (0, 1, 2))]
    with pytest.raises(PlacementError, match=r"asks for 4 GPUs.*6 exist.*rollout-0 \(4 GPUs on "
                                             r"one host\) finds no host"):
        place_devices(hosts, instances("big", 1, tp=4))


def test_no_gpu_at_all():
    with pytest.raises(PlacementError, match=r"no GPU here: the run asks for 2 GPUs.*0 exist "
                                             r"\(local \(any\): 0 \(none\)\).*trainer.device"):
        place_devices([Host("local", ())], slot(0, 2))


def test_colocate_shares_gpus_by_memory_and_puts_instances_near_their_trainer():
    def team(n_agents: int, rollout: float, trainer: float) -> list[Ask]:
        asks = [a for k in range(n_agents)
                for a in (Ask(f"trainer-{k}-0", "trainer", group=f"trainer-{k}", memory=trainer),)]
        return asks + [Ask(f"rollout-{k}", "rollout", label=f"agent{k}", memory=rollout,
                           near=f"trainer-{k}") for k in range(n_agents)]

    asks = team(4, 0.5, 0.4)
    plan = place_devices([Host("local", (0, 1, 2, 3))], asks, colocate=True)
    check_valid(plan, asks)
    # Each instance on its own agent's trainer GPU (CUDA IPC weight sync needs that); the
    # trainers spread first, one per GPU.
    assert [plan.seats[f"rollout-{k}"].devices for k in range(4)] == \
        [plan.seats[f"trainer-{k}-0"].devices for k in range(4)]
    assert len({plan.seats[f"trainer-{k}-0"].devices for k in range(4)}) == 4
    assert plan.paired({f"agent{k}": f"trainer-{k}" for k in range(4)})
    assert "(50% of each)" in plan.table()
    # The default team on one GPU (the check bench/gpu_check.py runs on a single GPU).
    one = place_devices([Host("local", (0,))], team(2, 0.3, 0.2), colocate=True)
    assert {s.devices for s in one.seats.values()} == {(0,)}
    with pytest.raises(PlacementError, match=r"asks for 4 GPUs .*at their memory shares.*3 exist"
                                             r".*devices.trainer_memory_fraction"):
        place_devices([Host("local", (0, 1, 2))], asks, colocate=True)
    # A slot's ranks never share a GPU (NCCL needs one per rank), even with room.
    with pytest.raises(PlacementError):
        place_devices([Host("local", (0,))], [Ask(f"trainer-0-{r}", "trainer", group="trainer-0",
                                                 memory=0.1) for r in range(2)], colocate=True)
    # Without colocate an instance and a rank never share.
    with pytest.raises(PlacementError, match="or devices.colocate = true"):
        place_devices([Host("local", (0,))], team(1, 0.3, 0.2))


def test_a_replacement_takes_the_dead_workers_gpus_and_a_new_node_gets_new_instances():
    asks = instances("a", 2) + slot(0, 2)
    plan = place_devices([Host("local", (0, 1, 2, 3))], asks)
    old = plan.seats["rollout-1"].devices
    plan.replace("rollout-1", "rollout-7")
    assert "rollout-1" not in plan.seats and plan.seats["rollout-7"].devices == old
    assert plan.take(Ask("rollout-8", "rollout")) is None  # every GPU is taken
    plan.add_host(Host("node-2", (0, 1), ("rollout",)))
    seat = plan.take(Ask("rollout-8", "rollout", label="a"), host="node-2")
    assert seat is not None and (seat.host, seat.devices) == ("node-2", (0,))
    assert plan.take(Ask("trainer-9-0", "trainer"), host="node-2") is None  # a rollout node
    assert "rollout-8" in plan.table() and "unused: node-2: 1" in plan.table()
    assert {"worker": "rollout-8", "role": "rollout", "serves": "a", "host": "node-2",
            "gpus": [0], "memory": 1.0} in plan.rows()


def test_parse_gpus():
    assert parse_gpus("auto") is None and parse_gpus("auto", visible=3) == (0, 1, 2)
    assert parse_gpus("none", visible=8) == ()
    assert parse_gpus("0-2,5", visible=8) == (0, 1, 2, 5)
    with pytest.raises(ConfigError, match=r'names GPUs \[4\] but 4 are visible here \(0-3\)'):
        parse_gpus("0,4", visible=4)
    with pytest.raises(ConfigError, match=r"names GPUs \[0\] but 0 are visible here \(none\)"):
        parse_gpus("0", visible=0)
    for bad in ("gpu0", "3-1", "-1", ""):
        with pytest.raises(ConfigError, match="devices.gpus must be"):
            DevicesConfig(gpus=bad)


@settings(max_examples=300, deadline=None)  # pure and fast; no deadline on a shared machine
@given(st.lists(st.tuples(st.integers(0, 8), st.sampled_from(["any", "rollout", "trainer"])),
                min_size=1, max_size=4),
       st.lists(st.integers(1, 4), max_size=6), st.lists(st.integers(1, 6), max_size=4),
       st.booleans())
def test_any_plan_is_valid_and_one_gpu_asks_fail_only_without_room(hosts, tps, slots, colocate):
    hs = [Host(f"h{i}", tuple(range(n)), (role,)) for i, (n, role) in enumerate(hosts)]
    share = 0.5 if colocate else 1.0
    asks = [Ask(f"rollout-{i}", "rollout", tp, memory=share) for i, tp in enumerate(tps)]
    for k, ranks in enumerate(slots):
        asks += [Ask(f"trainer-{k}-{r}", "trainer", group=f"trainer-{k}", memory=share)
                 for r in range(ranks)]
    try:
        plan = place_devices(hs, asks, colocate=colocate)
    except PlacementError:
        if all(tp == 1 for tp in tps) and all(h.roles == ("any",) for h in hs) and not colocate:
            # No host constraint at all: only capacity can be short.
            assert len(asks) > sum(len(h.gpus) for h in hs)
        return
    check_valid(plan, asks)


# ----------------------------------------------------------------------------- the run's wiring

def _config(*sets: str):
    """The run's config, with vLLM named: these tests place its instances on GPUs that this
    machine may lack (rollout.backend "auto" resolves on the GPUs really here)."""
    from flexmarl.config.load import load_config
    return load_config(None, ["rollout.backend=vllm", *sets])


def _team():
    from flexmarl.team import load_team
    return load_team(_config().team.path)


def _place_gpus(config, team, sizes, hosts):
    """place_gpus with the sections of `config`, as flexmarl.launch.build hands them."""
    from flexmarl.placement.layout import place_gpus
    return place_gpus(team, sizes, hosts, rollout=config.rollout,
                     trainer_device=config.trainer.device, devices=config.devices,
                     trainer_pool=config.trainer_pool)


def _settings(config):
    """The WorkerSettings flexmarl.launch.build makes of `config` (workers on this machine)."""
    from flexmarl.launch.workers import WorkerSettings
    from flexmarl.placement.cores import role_cpus, trainer_nice, trainers_on_local_cpu
    local_cpu = trainers_on_local_cpu(config.trainer.device, config.cluster.remote)
    return WorkerSettings(
        config.rollout, config.trainer, config.trainer_pool, config.devices, config.transport,
        seed=config.run.seed, stop_timeout_s=config.supervisor.stop_timeout_s,
        store_port=config.cluster.store_port,
        cpus=role_cpus(config.rollout.cpus, config.trainer_pool.cpus, config.trainer.device),
        nice=trainer_nice(config.trainer_pool, local_cpu),
        replace_attempts=config.supervisor.replace_attempts)


def _gpu_placement(config):
    """The dry run's GPU placement comments for `config`."""
    from flexmarl.launch.cli import _gpu_placement as shown
    return shown(config.team.path, config.cluster, rollout=config.rollout,
                 trainer_device=config.trainer.device, devices=config.devices,
                 trainer_pool=config.trainer_pool)


def test_the_run_places_vllm_instances_and_cuda_trainers_and_picks_the_weight_sync():
    team, four = _team(), [Host("local", (0, 1, 2, 3))]
    gpus = _place_gpus(_config("trainer.device=cuda"), team, [1, 1], four)
    assert gpus.transfer == "nccl" and gpus.rollout and gpus.trainer
    assert sorted(gpus.devices.seats) == ["rollout-0", "rollout-1", "trainer-0-0", "trainer-1-0"]
    assert {s.label for s in gpus.devices.seats.values()} >= {a.name for a in team.agents}
    colocated = _place_gpus(_config("trainer.device=cuda", "devices.colocate=true",
                                   "rollout.gpu_memory_utilization=0.25",
                                   "devices.trainer_memory_fraction=0.2"), team, [1, 1],
                           [Host("local", (0,))])
    assert colocated.transfer == "ipc"
    assert {s.devices for s in colocated.devices.seats.values()} == {(0,)}
    # A shared trainer pool: instances are not with their agent's trainer, so no IPC (and
    # NCCL cannot join two processes on one GPU): weights go the staged way.
    pooled = _place_gpus(_config("trainer.device=cuda", "devices.colocate=true",
                                "trainer_pool.slots=1", "rollout.gpu_memory_utilization=0.3",
                                "devices.trainer_memory_fraction=0.2"), team, [1], four)
    assert pooled.transfer == "stage"
    with pytest.raises(ConfigError, match="needs every GPU of every instance to host a rank"):
        _place_gpus(_config("trainer.device=cuda", "devices.colocate=true", "trainer_pool.slots=1",
                           "rollout.weight_transfer=ipc"), team, [1], four)
    # Trainers on CPU: vLLM still gets the GPUs, weights go the staged way.
    cpu_train = _place_gpus(_config(), team, [1, 1], four)
    assert (cpu_train.transfer, cpu_train.trainer, len(cpu_train.devices.seats)) == ("stage", False, 2)
    # No GPU and nothing asks for one: no placement at all (this machine's case).
    assert _place_gpus(_config(), team, [1, 1], [Host("local", ())]).devices is None
    with pytest.raises(PlacementError, match="no GPU here"):
        _place_gpus(_config("trainer.device=cuda"), team, [1, 1], [Host("local", ())])


def test_ipc_needs_a_rank_of_the_agents_slot_on_every_gpu_of_a_tensor_parallel_instance():
    """vLLM's IPC engine has each tensor-parallel worker look up its own GPU in the handles,
    and a trainer rank hands out handles of its own GPU only: a TP-2 instance beside a 1-rank
    slot shares one GPU with it, which is not enough ("IPC handle not found for GPU UUID")."""
    asks = [Ask("trainer-0-0", "trainer", group="trainer-0", memory=0.4),
            Ask("rollout-0", "rollout", 2, label="a", memory=0.45, near="trainer-0")]
    plan = place_devices([Host("local", (0, 1, 2, 3))], asks, colocate=True)
    assert 0 in plan.seats["rollout-0"].devices and len(plan.seats["rollout-0"].devices) == 2
    assert plan.unpaired({"a": "trainer-0"}) == ["rollout-0"]
    assert not plan.paired({"a": "trainer-0"})
    two = place_devices([Host("local", (0, 1, 2, 3))],
                       [Ask("trainer-0-1", "trainer", group="trainer-0", memory=0.4), *asks],
                       colocate=True)
    assert two.seats["rollout-0"].devices == (0, 1) and two.paired({"a": "trainer-0"})
    # The run: "auto" falls back to staged sync, an explicit "ipc" names the settings.
    team, four = _team(), [Host("local", (0, 1, 2, 3))]
    sets = ("trainer.device=cuda", "devices.colocate=true", "rollout.tensor_parallel_size=2",
            "rollout.gpu_memory_utilization=0.45", "devices.trainer_memory_fraction=0.4")
    assert _place_gpus(_config(*sets), team, [1, 1], four).transfer == "stage"
    assert _place_gpus(_config(*sets), team, [2, 2], four).transfer == "ipc"
    with pytest.raises(ConfigError, match=r"rollout.tensor_parallel_size = 2 .*rollout-0, "
                                          r"rollout-1 are not"):
        _place_gpus(_config(*sets, "rollout.weight_transfer=ipc"), team, [1, 1], four)


def test_a_gpu_node_without_vllm_runs_the_torch_engine_on_gpus_with_staged_sync(tmp_path):
    """rollout.backend = "torch" with trainers on GPU: its instances get GPUs like vLLM's and
    start with device "cuda"; weights go the staged way (no vLLM weight-transfer engine).
    With trainers on CPU the torch engine stays on CPU, as before."""
    from flexmarl.launch.workers import Workers

    team, four = _team(), [Host("local", (0, 1, 2, 3))]
    config = _config("rollout.backend=torch", "trainer.device=cuda")
    gpus = _place_gpus(config, team, [1, 1], four)
    assert (gpus.rollout, gpus.transfer, len(gpus.devices.seats)) == (True, "stage", 4)
    workers = Workers(object(), _settings(config), {a.name: "/m" for a in team.agents},
                       str(tmp_path), [1, 1], gpus)
    spec = workers.rollout(team.agents[0].name)
    assert spec.args["device"] == "cuda" and spec.env["CUDA_VISIBLE_DEVICES"]
    assert spec.args["weight_transfer"] == "stage"
    assert workers.trainer_slot(0)[0].args["keep_parked_memory"] is False  # GPUs of its own
    cpu = _place_gpus(_config("rollout.backend=torch"), team, [1, 1], four)
    assert cpu.devices is None and not cpu.rollout


def test_nccl_weight_sync_with_colocated_workers_is_refused():
    """NCCL refuses two ranks of one group on one GPU, and with devices.colocate the planner
    seats an instance on its trainer's GPU (on a one-GPU machine always): refused at start."""
    from flexmarl.placement.layout import resolve_transfer

    with pytest.raises(ConfigError, match='"nccl" cannot be used with devices.colocate = true'):
        resolve_transfer("nccl", vllm_on_gpu=True, trainer_on_gpu=True, colocate=True)
    with pytest.raises(ConfigError, match="devices.colocate"):
        _place_gpus(_config("trainer.device=cuda", "devices.colocate=true",
                           "rollout.weight_transfer=nccl", "rollout.gpu_memory_utilization=0.2",
                           "devices.trainer_memory_fraction=0.2"), _team(), [1, 1],
                   [Host("local", (0,))])


def test_colocated_shares_leave_the_reserve_free_on_every_gpu():
    """vLLM starts only if the free memory covers its whole share, and CUDA contexts, NCCL
    and receive buffers sit outside every share: shares on one GPU add up to at most
    1 - devices.reserve_fraction (0.1 by default)."""
    pair = [Ask("trainer-0-0", "trainer", group="trainer-0", memory=0.5),
            Ask("rollout-0", "rollout", label="a", memory=0.5, near="trainer-0")]
    with pytest.raises(PlacementError, match=r"may add up to 0.9, devices.reserve_fraction = 0.1"):
        place_devices([Host("local", (0,))], pair, colocate=True, reserve=0.1)
    assert len(place_devices([Host("local", (0,))], pair, colocate=True).seats) == 2  # reserve 0
    # The defaults (0.85 + 0.4) never fit one GPU: one error naming both shares.
    with pytest.raises(PlacementError, match=r"rollout.gpu_memory_utilization, "
                                             r"devices.trainer_memory_fraction"):
        _place_gpus(_config("trainer.device=cuda", "devices.colocate=true"), _team(), [1, 1],
                   [Host("local", (0,))])
    one = _place_gpus(_config("trainer.device=cuda", "devices.colocate=true",
                             "rollout.gpu_memory_utilization=0.25",
                             "devices.trainer_memory_fraction=0.2"), _team(), [1, 1],
                     [Host("local", (0,))])
    assert one.transfer == "ipc" and one.devices.reserve == 0.1
    # Its trainer ranks keep parked memory cached (flexmarl.training.parking.park): the engine
    # on their GPU sized itself at start, and memory handed back while an engine (re)starts
    # there trips vLLM's memory profiling.
    from flexmarl.launch.workers import Workers
    config = _config("trainer.device=cuda", "devices.colocate=true",
                     "rollout.gpu_memory_utilization=0.25", "devices.trainer_memory_fraction=0.2")
    workers = Workers(object(), _settings(config), {a.name: "/m" for a in _team().agents},
                       "/tmp", [1, 1], one)
    args = workers.trainer_slot(0)[0].args
    assert args["keep_parked_memory"] is True and args["memory_fraction"] == 0.2
    for bad in (-0.1, 1.0):
        with pytest.raises(ConfigError, match="devices.reserve_fraction"):
            DevicesConfig(reserve_fraction=bad)


def test_each_worker_starts_with_its_gpus_its_node_and_the_trainer_config(tmp_path):
    from flexmarl.launch.workers import Workers

    config = _config("trainer.device=cuda", "trainer.lr=3e-5", "rollout.tensor_parallel_size=2")
    team = _team()
    hosts = [Host("local", tuple(range(6)))]
    gpus = _place_gpus(config, team, [1, 1], hosts)
    workers = Workers(object(), _settings(config), {a.name: "/m" for a in team.agents},
                       str(tmp_path), [1, 1], gpus)
    first = workers.rollout(team.agents[0].name)
    assert first.name == "rollout-0" and first.node == ""  # local workers: no node
    assert first.env["CUDA_VISIBLE_DEVICES"] == "0,1"  # largest asks first: the TP-2 instances
    assert (first.args["tensor_parallel_size"], first.args["weight_transfer"]) == (2, "nccl")
    rank = workers.trainer_slot(1)[0]
    assert rank.args["config"]["device"] == "cuda" and rank.args["config"]["lr"] == 3e-5
    assert rank.env == {"CUDA_VISIBLE_DEVICES": "5"}
    # Replacements take the dead workers' GPUs; a new instance finds none left.
    second = workers.rollout(team.agents[1].name)
    again = workers.rollout(team.agents[1].name, replaces=second.name)
    assert again.env == second.env and second.name not in gpus.devices.seats
    assert workers.trainer_slot(1, generation=1)[0].env == {"CUDA_VISIBLE_DEVICES": "5"}
    from runtime.errors import WorkerStartError
    with pytest.raises(WorkerStartError, match=r"no free GPU for rollout-3 \(solver; 2 on one host\)"):
        workers.rollout(team.agents[0].name)


def test_worker_gpus_are_indices_of_the_gpus_the_run_itself_sees():
    from runtime.supervisor import visible_devices

    assert visible_devices("1", None) == "1" and visible_devices("0,1", "") == "0,1"
    assert visible_devices("0,2", "4,5,6") == "4,6"
    with pytest.raises(ValueError, match="sees only 3"):
        visible_devices("3", "4,5,6")


def test_dry_run_shows_the_placement(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)  # a machine without GPUs
    assert "none (GPUs used here: 0" in _gpu_placement(_config())
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    shown = _gpu_placement(_config("trainer.device=cuda"))
    assert shown.startswith("# placement: disaggregated")
    assert "\n# GPU placement (nccl weight sync):" in shown
    assert "# rollout-0" in shown and "# trainer-1-0" in shown
    assert "not enough GPUs" in _gpu_placement(_config("trainer.device=cuda",
                                                       "rollout.instances_per_agent=2"))
    assert "made when the nodes have joined" in _gpu_placement(
        _config("cluster.listen=tcp://127.0.0.1:5555"))


async def test_a_trainer_slot_starts_with_the_runs_trainer_config_and_its_gpus(
        tmp_path, tiny_model_dir, monkeypatch):
    """Real worker processes, as a run starts them: the [trainer] section reaches the slot at
    start (its device and process group come from it) and so do the GPUs of its seat. The
    second slot's seat is GPU 63, which no machine here has, so on CPU and GPU machines alike
    a slot started there with trainer.device = "cuda" says it sees no CUDA device, which it
    can only say if the config and the seat got there."""
    import dataclasses

    from flexmarl.placement.layout import GpuPlacement
    from flexmarl.launch.workers import Workers
    from flexmarl.protocol import SwapIn
    from runtime.errors import RemoteError
    from runtime.supervisor import Supervisor
    from runtime.transport import connect

    # Seat indices are the run's own GPU numbers: this process's CUDA_VISIBLE_DEVICES (a GPU
    # machine's) would map them (runtime.supervisor.visible_devices).
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    team = _team()
    seats = place_devices([Host("local", (0, 63))], slot(0, 1) + slot(1, 1))
    assert [seats.seats[f"trainer-{k}-0"].devices for k in (0, 1)] == [(0,), (63,)]
    cpu = Workers(object(), _settings(_config()), {}, str(tmp_path), [1, 1],
                   GpuPlacement(seats, "stage", False, True))
    cuda = Workers(object(), _settings(_config("trainer.device=cuda")), {}, str(tmp_path),
                    [1, 1], GpuPlacement(seats, "stage", False, True))
    specs = [cpu.trainer_slot(0)[0], cuda.trainer_slot(1)[0]]
    agent = team.agents[0].name
    sup = Supervisor()
    async with sup.serving():
        handles = await asyncio.gather(*(sup.start_worker(s) for s in specs))
        conns = [connect(h.address) for h in handles]
        try:
            done = await conns[0].request(SwapIn(agent, tiny_model_dir, specs[0].args["config"]),
                                          timeout_s=120)
            assert done.device == "cpu gloo visible=0" and done.how == "fresh"
            with pytest.raises(RemoteError, match=r"trainer.device is 'cuda' but this trainer "
                                                  r"process sees no CUDA device "
                                                  r"\(CUDA_VISIBLE_DEVICES=63"):
                await conns[1].request(SwapIn(agent, tiny_model_dir, specs[1].args["config"]),
                                       timeout_s=120)
            # A slot's device is fixed at start: an agent config for another device is refused.
            wrong = dataclasses.replace(_config().trainer, device="cuda")
            with pytest.raises(RemoteError, match="a slot's device and process group are fixed"):
                await conns[0].request(SwapIn("other", tiny_model_dir,
                                              dataclasses.asdict(wrong)), timeout_s=120)
        finally:
            for c in conns:
                await c.aclose()
            await sup.stop_workers()


def test_the_monitor_shows_each_workers_gpus():
    """The dashboard's instance and slot tables get "HOST:GPUS" from the pool's placement."""
    from flexmarl.observe.monitor import _gpus

    plan = place_devices([Host("local", (0, 1, 2, 3))],
                        instances("a", 1, tp=2) + slot(0, 2))
    shown = _gpus(plan.rows())
    assert shown == {"rollout-0": "local:2,3", "trainer-0-0": "local:0", "trainer-0-1": "local:1"}


def test_workers_of_a_lost_node_are_placed_again_on_the_nodes_left(tmp_path):
    """A node's GPUs go with it: the replacement of an instance that ran there is seated on
    another node's free GPUs (and started on that node), not on the lost one."""
    from flexmarl.launch.workers import hosts
    from flexmarl.placement.lora_units import LoraUnits
    from flexmarl.launch.workers import Workers
    from runtime.protocol import NodeHello
    from runtime.registry import NodeInfo, NodeRegistry

    registry = NodeRegistry("tcp://127.0.0.1:0")
    for name, roles, gpus in (("r1", ["rollout"], 1), ("r2", ["rollout"], 2),
                              ("t1", ["trainer"], 2)):
        registry.nodes[name] = NodeInfo(NodeHello(name, "h", roles, "tcp://h:1", 1, devices=gpus),
                                        conn=None, joined_at=0.0)
    config = _config("trainer.device=cuda", "cluster.listen=tcp://127.0.0.1:0")
    team = _team()
    gpus = _place_gpus(config, team, [1, 1], hosts(config.devices.gpus, registry))
    workers = Workers.__new__(Workers)  # no TCPStore: only the placement is exercised
    workers.sup, workers.settings, workers.gpus = registry, _settings(config), gpus
    workers.model_dirs = {a.name: "/m" for a in team.agents}
    workers.rollout_cpus, workers.rollout_env, workers.time_shared = (), {}, frozenset()
    workers.units = LoraUnits()  # no LoRA agents
    import itertools
    workers._instances = itertools.count(2)
    on_r1 = next(w for w, s in gpus.devices.seats.items() if s.host == "r1")
    registry.nodes["r1"].alive = False
    again = workers.rollout(team.agents[0].name, replaces=on_r1)
    assert again.node == "r2"
    on_r2 = [s.devices for s in gpus.devices.seats.values() if s.host == "r2"]
    assert sorted(on_r2) == [(0,), (1,)]  # beside the instance already there, not on it
    assert "r1" not in {h.name for h in gpus.devices.hosts} and on_r1 not in gpus.devices.seats


def test_time_shared_instances_sit_on_their_group_s_slot_and_take_no_gpu_of_their_own():
    """devices.placement time_shared: each agent's slot comes after the shared ones, pinned to
    it, and its instances run on that slot's GPUs (engines asleep while it trains)."""
    from flexmarl.placement.layout import slot_layout
    config = _config("trainer.device=cuda", "devices.placement=solver=time_shared")
    team = _team()
    layout = slot_layout(team, config.trainer_pool, config.devices)
    assert layout.sizes == [1, 1] and layout.pinned == {"solver": "trainer-1"}
    gpus = _place_gpus(config, team, layout.sizes, [Host("local", (0, 1, 2))])
    seats = gpus.devices.seats
    [solver] = [s for s in seats.values() if s.role == "rollout" and s.label == "solver"]
    assert solver.devices == seats["trainer-1-0"].devices and solver.inside == "trainer-1"
    assert gpus.transfer == "stage"  # the trainer is parked while the engines take weights
    assert "(time-shared with trainer-1)" in gpus.devices.table()
    grouped = _config("trainer.device=cuda", "devices.placement=solver+checker=time_shared")
    layout = slot_layout(team, grouped.trainer_pool, grouped.devices)
    assert layout.sizes == [1] and set(layout.pinned.values()) == {"trainer-0"}


@pytest.mark.parametrize("sets, match", [
    (("devices.placement=time_shared", "rollout.backend=vllm"), "sleep mode"),
    (("devices.placement=time_shared", "trainer.device=cpu"), "take turns on the same"),
    (("devices.placement=time_shared", "trainer.device=cuda",
      "rollout.weight_transfer=nccl"), 'use "stage"'),
    (("devices.placement=nobody=time_shared",), "the team has")])
def test_time_shared_placements_that_cannot_run_are_refused_with_the_way_out(sets, match):
    from flexmarl.placement.layout import slot_layout
    config = _config(*sets)
    team = _team()
    gpu = [Host("local", (0, 1))] if "rollout.backend=vllm" not in sets else [Host("local", ())]
    with pytest.raises(ConfigError, match=match):
        _place_gpus(config, team, slot_layout(team, config.trainer_pool, config.devices).sizes
                   if "nobody" not in sets[0] else [1, 1], gpu)


def test_the_dry_run_says_which_agents_are_time_shared():
    shown = _gpu_placement(_config("devices.placement=solver=time_shared", "rollout.backend=torch"))
    assert "# placement: time-shared solver on trainer-1" in shown
    assert "disaggregated checker" in shown
    assert "# placement: disaggregated" in _gpu_placement(_config())
