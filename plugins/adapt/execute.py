"""Carry out a merge plan out of core: one output tensor at a time, sharded, into a directory that appears whole.

Each planned tensor is computed from its input tensors, read one at a time from the safetensors files, and handed
to `kinfolk.tensors.ShardedWriter`; memory holds at most the pending output shard plus the few tensors of one
recipe. Everything is written inside `kinfolk.atomic.atomic_directory`, so an interrupted merge leaves nothing at
the destination. Beside the weights go the config, the config donor's tokenizer and other small files, the
layer map and `kinfolk_merge.json` (provenance: op, config, fingerprints of the inputs, versions). Outputs are
deterministic: the same inputs and config give byte-identical files.
"""

from __future__ import annotations

import os
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
import transformers

from kinfolk import __version__, console
from kinfolk.atomic import atomic_directory, check_destination, write_json
from kinfolk.diskspace import check_free_space
from kinfolk.errors import MergeError
from kinfolk.plugins.adapt.checkpoint import PROVENANCE_FILE, SAFETENSORS_DTYPES, Checkpoint
from kinfolk.plugins.adapt.layer_map import LAYER_MAP_FILE
from kinfolk.plugins.adapt.plan import MergePlan, ModelPlan, PlannedTensor
from kinfolk.tensors import INDEX_FILE, ShardedWriter

FAMILY_FILE = "family.json"
# Files of the config donor that are not copied: weights (the merge writes its own), the config (rewritten) and
# kinfolk's own records of the donor's history.
_NOT_COPIED = ("*.safetensors", INDEX_FILE, "*.bin", "*.bin.index.json", "*.pt", "*.pth", "*.gguf", "*.h5")
_REWRITTEN = {"config.json", LAYER_MAP_FILE, PROVENANCE_FILE, FAMILY_FILE, "adapt_delta.json", "README.md"}


def materialise(tensor: PlannedTensor, inputs: dict[str, Checkpoint]) -> torch.Tensor:
    """Compute one planned tensor; sums run in float32 (float64 if any side is float64) and are cast at the end."""
    out_dtype = SAFETENSORS_DTYPES[tensor.dtype]
    terms = tensor.terms
    if len(terms) == 1 and terms[0].weight == 1:
        return inputs[terms[0].source].reader.get(terms[0].tensor).to(out_dtype)
    source_dtypes = {inputs[term.source].manifest[term.tensor][1] for term in terms}
    if not source_dtypes <= {"F64", "F32", "BF16", "F16"}:
        raise MergeError(
            f"tensor {tensor.name!r} is {sorted(source_dtypes)}: only floating-point tensors can be summed"
        )
    compute = torch.float64 if "F64" in source_dtypes or out_dtype == torch.float64 else torch.float32
    # Tensors come straight from the memory-mapped files: writing into one would copy its pages first, so the sum
    # goes into fresh memory and is updated in place only once it is ours.
    result, owned = None, False
    for term in terms:  # one input tensor in memory at a time, beside the running sum
        stored = inputs[term.source].reader.get(term.tensor)
        value = stored.to(compute)
        copied = value is not stored
        if result is None:
            result, owned = (value, copied) if term.weight == 1 else (value * term.weight, True)
        elif owned:
            result.add_(value, alpha=term.weight)
        else:
            result, owned = torch.add(result, value, alpha=term.weight), True
        del stored, value
    return result.to(out_dtype)


def _copy_donor_files(source: Path, destination: Path) -> None:
    for path in sorted(source.iterdir()):
        if path.is_file() and path.name not in _REWRITTEN and not any(path.match(p) for p in _NOT_COPIED):
            shutil.copyfile(path, destination / path.name)


def _provenance(plan: MergePlan, model: ModelPlan, fingerprints: dict[str, str]) -> dict[str, Any]:
    return {
        "tool": "kinfolk merge",
        "op": plan.op,
        "kinfolk_version": __version__,
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "config": plan.config.to_dict(),
        "inputs": {
            role: {"path": str(checkpoint.path), "fingerprint": fingerprints[role]}
            for role, checkpoint in plan.inputs.items()
        },
        "output": {**model.summary, "num_tensors": len(model.tensors), "bytes": model.nbytes},
    }


class _Background:
    """Work that overlaps with the merge on two threads (both release the GIL): fingerprinting the inputs for
    provenance, and flushing each written shard to disk while the next one is computed, so that the final fsync
    of `atomic_directory` finds little left to do."""

    def __init__(self, inputs: dict[str, Checkpoint]):
        self._hashing_pool, self._flushing_pool = ThreadPoolExecutor(1), ThreadPoolExecutor(1)
        self._hashes = {
            role: self._hashing_pool.submit(lambda checkpoint: checkpoint.fingerprint, cp)
            for role, cp in inputs.items()
        }
        self._flushes = []

    def flush_soon(self, path: Path) -> None:
        descriptor = os.open(path, os.O_RDONLY)  # opened now: the writer renames the file later
        self._flushes.append(self._flushing_pool.submit(_fsync_and_close, descriptor))

    def fingerprints(self) -> dict[str, str]:
        for flush in self._flushes:
            flush.result()
        return {role: future.result() for role, future in self._hashes.items()}

    def close(self) -> None:
        for pool in (self._hashing_pool, self._flushing_pool):
            pool.shutdown(wait=True, cancel_futures=True)


def _fsync_and_close(descriptor: int) -> None:
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def execute(plan: MergePlan, out: str | Path, overwrite: bool = False, progress: bool = True) -> Path:
    """Write every model of `plan` under `out` (refused if it exists, unless `overwrite`); returns `out`."""
    destination = check_destination(out, overwrite)
    total = sum(model.nbytes for model in plan.models)
    check_free_space(destination, total, f"{len(plan.models)} model{'s' * (len(plan.models) > 1)}' tensors")
    background = _Background(plan.inputs)
    try:
        with (
            atomic_directory(destination, overwrite) as staging,
            console.bar(total=total, unit="B", unit_scale=True, desc=f"merge {plan.op}", disable=not progress) as bar,
        ):
            for model in plan.models:
                directory = staging / model.subdir
                shards = ShardedWriter(directory, plan.config.max_shard_bytes, model.metadata, background.flush_soon)
                with shards as writer:
                    for tensor in model.tensors:
                        writer.make_room(tensor.nbytes)  # flush first: a full shard and new inputs never meet
                        writer.add(tensor.name, materialise(tensor, plan.inputs))
                        bar.update(tensor.nbytes)
                _write_companions(plan, model, directory)
            fingerprints = background.fingerprints()
            for model in plan.models:
                write_json(staging / model.subdir / PROVENANCE_FILE, _provenance(plan, model, fingerprints))
            if any(model.subdir for model in plan.models):
                family = [{"dir": model.subdir, **model.summary} for model in plan.models]
                write_json(staging / FAMILY_FILE, {"op": plan.op, "models": family})
    finally:
        background.close()
    return destination


def _write_companions(plan: MergePlan, model: ModelPlan, directory: Path) -> None:
    if model.donor is not None:
        _copy_donor_files(plan.inputs[model.donor].path, directory)
    if model.config is not None:
        model.config.save_pretrained(directory)
    if model.layer_map is not None:
        model.layer_map.save(directory)
    for name, payload in model.files.items():
        write_json(directory / name, payload)
