"""Weight-sync benchmark: push each model size's weights to a live rollout instance.

For every size in flexmarl.models.SIZES it builds a model directory, starts one rollout worker
process (vLLM when installed, else the torch backend; `--backend` to choose), and syncs the
full weights `--pushes` times as new versions, two ways, alternating:

- published (the product's path, flexmarl.weights.published): this process, as a trainer's
  rank 0, writes the version's file on this host (`publish s`), then sends the instance its
  name (WeightUpdate.source); the instance reads the file and loads it in place. `sync s` is
  the two together: from the exported tensors to the instance serving them.
- inline (for comparison: what the run did before issue 54): the tensors in the WeightUpdate
  itself, zero-copy frames over ipc:// or tcp://.

Beside them, in the same run, a plain in-memory copy of the same tensors into preallocated
buffers (memcpy). Times are medians over the pushes.

    .venv/bin/python bench/weight_sync.py [--json] [--sizes tiny,small,medium] [--pushes 5]
                                          [--backend vllm|torch] [--transport ipc|tcp]
                                          [--model smollm2-135m|DIR|FILE.gguf] [--train-layers N]

`--model` measures that model (any AgentSpec.model) instead of the built-in sizes; with
`--train-layers N` the same instance also gets partial pushes of only the last N blocks and the
final norm (what a sync sends with AgentSpec.train_layers = N), side by side with full pushes.

With --json the last line is one JSON object: `sync_gbps`, `memcpy_gbps` and `sync_vs_memcpy`
(memcpy seconds / sync seconds) of the published path for the largest size measured, and per
size and path its bytes, publish, push and sync seconds, GB/s, engine load seconds and memcpy.
"""
from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import statistics
import sys
import tempfile
import time

# `python bench/weight_sync.py` puts bench/, not the repository root, on sys.path.
if importlib.util.find_spec("flexmarl") is None:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch

READY_TIMEOUT_S = 600.0
TIMEOUT_S = 300.0  # rollout.request_timeout_s's default: one push of the largest model


def memcpy_seconds(tensors: dict[str, torch.Tensor], repeats: int) -> float:
    dst = {k: torch.empty_like(v) for k, v in tensors.items()}
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for k, v in tensors.items():
            dst[k].copy_(v)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


async def bench_size(size: str, args: argparse.Namespace, workdir: str) -> list[dict]:
    from flexmarl.models import build_model_dir

    return await bench_dir(size, str(build_model_dir(size, os.path.join(workdir, size))), args)


async def bench_dir(size: str, model_dir: str, args: argparse.Namespace) -> list[dict]:
    """Full pushes of `model_dir`'s weights (and with --train-layers, partial ones) into one
    instance; a row for each."""
    from flexmarl.models import load_model
    from flexmarl.weights import published
    from flexmarl.weights.stage import push_weights
    from flexmarl.training.trainer import freeze_all_but
    from runtime.supervisor import Supervisor, WorkerSpec
    from runtime.transport import connect

    model = load_model(model_dir)
    tensors = {k: v.detach().clone() for k, v in model.state_dict().items()
               if k != "lm_head.weight"}  # tied to the embeddings, as a trainer exports them
    variants = [(size, tensors)]
    if args.train_layers:
        trained = set(freeze_all_but(model, args.train_layers))
        variants.append((f"{size} last {args.train_layers}",
                         {k: v for k, v in tensors.items() if k in trained}))
    bind = "tcp://127.0.0.1:0" if args.transport == "tcp" else "ipc://*"
    sup = Supervisor()
    async with sup.serving():
        started = time.perf_counter()
        handle = await sup.start_worker(WorkerSpec(
            name=f"rollout-{size}", entry="flexmarl.rollout.worker:rollout_worker", bind=bind,
            args={"backend": args.backend, "model_dir": model_dir, "kv_cache_bytes": 64 << 20},
            ready_timeout_s=READY_TIMEOUT_S))
        print(f"[bench] {size}: {args.backend} instance up in {time.perf_counter() - started:.1f} s",
              file=sys.stderr)
        run = published.run_name()
        try:
            async with connect(handle.address) as conn:
                await push_weights([conn], 1, tensors, timeout_s=TIMEOUT_S)  # warm-up
                rows, version = [], 2
                for name, part in variants:
                    reports: dict[str, list] = {"published": [], "inline": []}
                    for _ in range(args.pushes):
                        t0 = time.perf_counter()
                        source = await asyncio.to_thread(published.publish, part, run, "bench",
                                                         version, handle.address)
                        publish_s = time.perf_counter() - t0
                        r = await push_weights([conn], version, source=source,
                                               complete=part is tensors, timeout_s=TIMEOUT_S)
                        reports["published"].append((publish_s, r))
                        r = await push_weights([conn], version + 1, part, timeout_s=TIMEOUT_S)
                        reports["inline"].append((0.0, r))
                        version += 2
                    copy_s = memcpy_seconds(part, max(args.pushes, 5))
                    rows += [_row(name, path, part, reports[path], copy_s)
                             for path in ("published", "inline")]
        finally:
            published.remove(run)
    return rows


def _row(name: str, path: str, tensors: dict[str, torch.Tensor], reports: list,
         copy_s: float) -> dict:
    from flexmarl.weights.base import weights_nbytes

    nbytes = weights_nbytes(tensors)
    publish_s = statistics.median(p for p, _ in reports)
    push_s = statistics.median(r.seconds for _, r in reports)
    sync_s = statistics.median(p + r.seconds for p, r in reports)
    load_s = statistics.median(next(iter(r.load_s.values())) for _, r in reports)
    return {"size": name, "path": path, "bytes": nbytes, "publish_s": publish_s,
            "push_s": push_s, "sync_s": sync_s, "sync_gbps": nbytes / sync_s / 1e9,
            "load_s": load_s, "memcpy_s": copy_s, "memcpy_gbps": nbytes / copy_s / 1e9,
            "sync_vs_memcpy": copy_s / sync_s}


def table(rows: list[dict], args: argparse.Namespace) -> str:
    out = [f"weight sync to one {args.backend} rollout instance over {args.transport} "
           f"(median of {args.pushes} pushes)",
           f"{'size':<22} {'path':<10} {'MB':>8} {'publish s':>10} {'sync s':>9} "
           f"{'sync GB/s':>10} {'engine load s':>14} {'rest s':>8} {'memcpy GB/s':>12} "
           f"{'sync/memcpy':>12}",
           "-" * 122]
    for r in rows:
        out.append(f"{r['size']:<22} {r['path']:<10} {r['bytes'] / 1e6:>8.2f} "
                   f"{r['publish_s']:>10.4f} {r['sync_s']:>9.4f} {r['sync_gbps']:>10.3f} "
                   f"{r['load_s']:>14.4f} {r['push_s'] - r['load_s']:>8.4f} "
                   f"{r['memcpy_gbps']:>12.2f} {r['sync_vs_memcpy']:>11.3f}x")
    out.append("publish s: the trainer's write of the version's file; sync s: from the exported "
               "tensors to the instance's acknowledgement (publish + push); engine load s: "
               "inside the engine's load_weights (vLLM: its own staging file + in-place reload); "
               "rest s: the push minus the load (published: reading the file; inline: encode, "
               "transport, decode)")
    return "\n".join(out)


async def main(args: argparse.Namespace) -> None:
    from flexmarl.models import SIZES

    if args.model:
        from flexmarl.launch.model_dirs import resolve_model
        from flexmarl.team import AgentSpec
        model_dir = resolve_model(AgentSpec(name="bench", model=args.model))
        rows = await bench_dir(os.path.basename(args.model.rstrip("/")), model_dir, args)
    else:
        sizes = args.sizes.split(",") if args.sizes else list(SIZES)
        unknown = [s for s in sizes if s not in SIZES]
        if unknown:
            raise SystemExit(f"unknown sizes {unknown}; choose from {sorted(SIZES)}")
        with tempfile.TemporaryDirectory(prefix="flexmarl-bench-") as workdir:
            rows = [r for size in sizes for r in await bench_size(size, args, workdir)]
    print(table(rows, args))
    if args.json:
        largest = max((r for r in rows if r["path"] == "published"), key=lambda r: r["bytes"])
        print(json.dumps({"sync_gbps": largest["sync_gbps"], "memcpy_gbps": largest["memcpy_gbps"],
                          "sync_vs_memcpy": largest["sync_vs_memcpy"],
                          "largest_size": largest["size"], "backend": args.backend,
                          "transport": args.transport, "sizes": rows}))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    ap.add_argument("--sizes", default="", help="comma-separated model sizes (default: all)")
    ap.add_argument("--pushes", type=int, default=5, help="timed pushes per size (default 5)")
    ap.add_argument("--backend", choices=["vllm", "torch"],
                    default="vllm" if importlib.util.find_spec("vllm") else "torch")
    ap.add_argument("--transport", choices=["ipc", "tcp"], default="ipc")
    ap.add_argument("--model", default="", help="an AgentSpec.model (e.g. smollm2-135m) "
                    "instead of the built-in sizes")
    ap.add_argument("--train-layers", type=int, default=0,
                    help="also push only the last N blocks + final norm, side by side")
    return ap.parse_args(argv)


if __name__ == "__main__":
    import uvloop
    uvloop.run(main(parse_args()))
