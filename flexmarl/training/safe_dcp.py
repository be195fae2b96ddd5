"""SafeReader: torch DCP's FileSystemReader, reading `.metadata` without running its pickle.

torch's FileSystemReader.read_metadata is a bare `pickle.load` of DIR/.metadata: a run dir
from someone else could run any code in the trainer the moment it resumes (or `flexmarl eval`
reads a state). FlexMARL's DCP states (flexmarl.training.sharded_state.write, read back by
sharded_state.read and state_files.read_whole) need only a few classes in that pickle; this
reader's unpickler finds those and refuses every other, before anything of it is called.

The allowed classes are what the metadata of FlexMARL's states holds (listed with a recording
Unpickler over the states of a full and a LoRA trainer, one process and two FSDP ranks, with
AdamW's state): DCP's own metadata dataclasses, torch.Size, torch's dtypes, the layout lookup
torch pickles layouts with, and the PosixPath of StorageMeta.checkpoint_id. Left out on
purpose: BytesStorageMetadata. FlexMARL's states hold tensors only, and DCP reads a "bytes"
entry back with an unrestricted torch load (weights_only off): a second way to run a pickle.
"""
from __future__ import annotations

import os
import pickle
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

NOT_OURS = "is not a DCP checkpoint made by FlexMARL (resume only run dirs you made)"

_ALLOWED = frozenset({
    ("torch.distributed.checkpoint.metadata", "Metadata"),
    ("torch.distributed.checkpoint.metadata", "StorageMeta"),
    ("torch.distributed.checkpoint.metadata", "MetadataIndex"),
    ("torch.distributed.checkpoint.metadata", "TensorStorageMetadata"),
    ("torch.distributed.checkpoint.metadata", "ChunkStorageMetadata"),
    ("torch.distributed.checkpoint.metadata", "TensorProperties"),
    ("torch.distributed.checkpoint.metadata", "_MEM_FORMAT_ENCODING"),  # an Enum, by value
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),  # a dict lookup of torch's layouts by name
    ("pathlib", "PosixPath"),  # StorageMeta.checkpoint_id: a path object, no file touched
})


class _MetadataUnpickler(pickle.Unpickler):
    """Finds the allowed classes only; every other global is refused unresolved, so nothing
    the pickle names (os.system, builtins.eval, ...) is ever imported or called."""

    def __init__(self, file: Any, path: str) -> None:
        super().__init__(file)
        self.path = path

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)  # a tensor's dtype (torch.float32, ...)
        raise pickle.UnpicklingError(
            f"{self.path} names {module}.{name}, which a FlexMARL checkpoint's metadata never "
            f"holds: refused unread. The dir {NOT_OURS}")

    def persistent_load(self, pid: Any) -> Any:  # the default refuses too; said here, named
        raise pickle.UnpicklingError(f"{self.path} holds a persistent id: the dir {NOT_OURS}")


class SafeReader(FileSystemReader):
    """FileSystemReader whose read_metadata unpickles with the allow-list above, then checks
    what came out: a Metadata of tensor entries whose data files lie in the checkpoint dir."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        path = self._get_metadata_path(kwargs.get("rank"))
        with self.fs.create_stream(path, "rb") as f:
            metadata = _MetadataUnpickler(f, str(path)).load()
        _check(metadata, str(path))
        # As FileSystemReader.read_metadata does after its load.
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


def _check(metadata: Any, path: str) -> None:
    """The unpickled objects are of allowed classes, but not necessarily where DCP expects
    them: a wrong shape is refused here rather than failing somewhere inside dcp.load."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    if type(metadata) is not Metadata:
        raise pickle.UnpicklingError(f"{path} holds a {type(metadata).__name__}, not DCP "
                                     f"Metadata: the dir {NOT_OURS}")
    if not (isinstance(metadata.state_dict_metadata, dict)
            and isinstance(metadata.storage_data, dict)):
        raise pickle.UnpicklingError(f"{path}: its Metadata has no tables of entries and data "
                                     f"files: the dir {NOT_OURS}")
    for fqn, md in metadata.state_dict_metadata.items():
        if type(md) is not TensorStorageMetadata:
            raise pickle.UnpicklingError(f"{path}: entry {fqn!r} is a {type(md).__name__}, not "
                                         f"a tensor: the dir {NOT_OURS}")
    for info in metadata.storage_data.values():
        # The data files FlexMARL writes sit next to .metadata (__R_N.distcp): a path that
        # leaves the dir would have DCP read some other file of this machine.
        name = getattr(info, "relative_path", None)
        if not isinstance(name, str) or name in ("", ".", "..") or os.path.basename(name) != name:
            raise pickle.UnpicklingError(f"{path}: data file {name!r} is not a file of the "
                                         f"checkpoint dir: the dir {NOT_OURS}")
