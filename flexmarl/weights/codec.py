"""CUDA IPC handles as plain data, both ways: the trainer encodes (flexmarl.weights.direct's
Sender, backend "ipc"), the instance decodes (flexmarl.weights.direct.engine_phase).

    update_info["ipc_handles"] ──ipc_payload──► update_info["ipc_handles_plain"] (runtime codec)
    ──► WeightTransfer("update") ──► plain_handles ──► torch objects for vLLM's IPC engine

The handles are torch.multiprocessing's rebuild_cuda_tensor arguments; carrying them as plain
data rather than pickles means an instance rebuilds only the tensor and storage classes on the
allow-list (`_types`), never an arbitrary object.
"""
from __future__ import annotations

from typing import Any

import torch


def ipc_payload(update_info: dict) -> dict:
    """CUDA IPC handles (torch.multiprocessing's rebuild_cuda_tensor arguments: tuples holding
    a tensor class, a torch.Size, a dtype and handle bytes) in plain data our codec carries, no
    pickle: `plain_handles` turns them back on the instance."""
    info = dict(update_info)
    handles = info.pop("ipc_handles", None)
    if handles is not None:
        info["ipc_handles_plain"] = _plain(handles)
    return info


def _types() -> dict[str, type]:
    """The only classes a handle may name (the tensor and storage classes)."""
    kinds = (torch.Tensor, torch.nn.Parameter, torch.UntypedStorage, torch.TypedStorage)
    return {f"{t.__module__}.{t.__qualname__}": t for t in kinds}


def _plain(value: Any) -> Any:
    if isinstance(value, torch.Size):
        return {"size": list(value)}
    if isinstance(value, torch.dtype):
        return {"dtype": str(value).removeprefix("torch.")}
    if isinstance(value, type):
        name = f"{value.__module__}.{value.__qualname__}"
        if name not in _types():
            raise TypeError(f"an IPC handle names class {name}, not a tensor or storage class")
        return {"type": name}
    if isinstance(value, tuple):
        return {"tuple": [_plain(v) for v in value]}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {"dict": [[k, _plain(v)] for k, v in value.items()]}
    if value is None or isinstance(value, (bool, int, float, str, bytes)):
        return value
    raise TypeError(f"an IPC handle holds a {type(value).__name__}, which it cannot carry")


def plain_handles(value: Any) -> Any:
    """The inverse of ipc_payload's encoding (classes only from the allow-list)."""
    if isinstance(value, list):
        return [plain_handles(v) for v in value]
    if not isinstance(value, dict):
        return value
    (kind, inner), = value.items()
    if kind == "size":
        return torch.Size(inner)
    if kind == "dtype":
        dtype = getattr(torch, inner, None)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"an IPC handle names dtype {inner!r}, which torch does not have")
        return dtype
    if kind == "type":
        types = _types()
        if inner not in types:
            raise ValueError(f"an IPC handle names class {inner!r}, not a tensor or storage class")
        return types[inner]
    if kind == "tuple":
        return tuple(plain_handles(v) for v in inner)
    if kind == "dict":
        return {k: plain_handles(v) for k, v in inner}
    raise ValueError(f"unknown IPC handle part {kind!r}")
