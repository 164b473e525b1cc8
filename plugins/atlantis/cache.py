"""Per-model scores on disk, in chunks, keyed by what determines them: the model, the dataset and the template.

A cache directory is named by `fingerprint(model, dataset, template, run options)`; each chunk of rows is one
`.npz` written atomically, so a killed run leaves only whole chunks and the next run computes only the chunks
that are missing. Processes of a multi-process run each write their own chunks into the same directory.
Each chunk records the fingerprint of what it was computed from (the cache's key, its number and its rows).
Opening a cache removes the staging files of writers that died; a chunk that cannot be used is discarded with a
warning naming its number, its file and the rows scored again, and only those rows are scored again: one that
cannot be read back (truncated by a full disk or a copy), holds other rows than the plan's, or whose fingerprint
is not this cache's (a chunk copied in from another model's or dataset's cache).

>>> import tempfile, numpy as np
>>> cache = ScoreCache(tempfile.mkdtemp(), "0123abcd", {"role": "small_base"})
>>> cache.write(3, rows=np.array([5, 1]), logprob=np.array([-2.5, -1.0]), tokens=np.array([4, 2]))
>>> cache.read(3)["logprob"].tolist(), cache.read(0)
([-2.5, -1.0], None)
>>> cache.read(3, expected_rows=[1, 2]) is None  # another plan's chunk: discarded
True
"""

from __future__ import annotations

import hashlib
import logging
import os
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from datasets import Dataset
from transformers import PreTrainedTokenizerBase

from kinfolk.atomic import atomic_file, clean_dead_staging, file_sha256, fingerprint, write_json

logger = logging.getLogger(__name__)

# Bump when scoring semantics change, so old caches are not reused.
SCORER_VERSION = 1
_HASH_BYTES = 1 << 20


def default_cache_dir() -> Path:
    if os.environ.get("KINFOLK_CACHE"):
        return Path(os.environ["KINFOLK_CACHE"]) / "scores"
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "kinfolk" / "scores"


def _head_tail_sha256(path: Path) -> str:
    """Hash of a weight file's size, first and last MiB: cheap on 100 GB checkpoints, and a re-save changes it."""
    size = path.stat().st_size
    with open(path, "rb") as handle:
        head = handle.read(_HASH_BYTES)
        handle.seek(max(0, size - _HASH_BYTES))
        tail = handle.read(_HASH_BYTES)
    return fingerprint(size, hashlib.sha256(head).hexdigest(), hashlib.sha256(tail).hexdigest())


def model_fingerprint(model_dir: str | Path) -> str:
    """Identity of a saved model: its JSON files in full and each weight file's size, head and tail."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        return fingerprint(str(model_dir))  # a Hub id: its name is all we know offline
    parts = []
    for path in sorted(model_dir.iterdir()):
        if path.suffix == ".json" or path.name.endswith(".jinja"):
            parts.append((path.name, file_sha256(path)))
        elif path.suffix in (".safetensors", ".bin", ".pt"):
            parts.append((path.name, _head_tail_sha256(path)))
    return fingerprint(parts)


def dataset_fingerprint(dataset: Dataset, columns: list[str]) -> str:
    """Hash of the contents of `columns` (row order included), independent of where the dataset came from."""
    digest = hashlib.sha256()
    for batch in dataset.select_columns(columns).with_format("arrow").iter(batch_size=4096):
        sink = pa.BufferOutputStream()
        table = pa.Table.from_batches([batch]) if isinstance(batch, pa.RecordBatch) else batch
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
        digest.update(sink.getvalue().to_pybytes())
    return digest.hexdigest()[:16]


def template_fingerprint(tokenizer: PreTrainedTokenizerBase, sft_args: Any) -> str:
    """Identity of the text-to-tokens step: the tokenizer, its chat template and the SFT masking options."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    vocabulary = backend.to_str() if backend is not None else sorted(tokenizer.get_vocab().items())
    options = {
        name: getattr(sft_args, name, None)
        for name in ("completion_only_loss", "assistant_only_loss", "dataset_text_field", "eos_token")
    }
    return fingerprint(vocabulary, tokenizer.chat_template, str(tokenizer.eos_token), options)


class ScoreCache:
    """Chunks of one model's scores on one dataset: `write(k, rows=..., logprob=..., tokens=...)`, `read(k)`."""

    def __init__(self, root: str | Path, key: str, meta: dict[str, Any]):
        self.key = key
        self.directory = Path(root) / key
        self.directory.mkdir(parents=True, exist_ok=True)
        clean_dead_staging(self.directory)  # once here, rather than beside each chunk written
        meta_path = self.directory / "meta.json"
        if not meta_path.exists():
            write_json(meta_path, {"scorer_version": SCORER_VERSION, **meta})

    def _path(self, chunk: int) -> Path:
        return self.directory / f"chunk-{chunk:06d}.npz"

    def inputs_fingerprint(self, chunk: int, rows: Sequence[int]) -> str:
        """What chunk `chunk` of `rows` is computed from: this cache's key (model, data, template, options)."""
        return fingerprint(self.key, chunk, sorted(int(row) for row in rows))

    def read(self, chunk: int, expected_rows: Sequence[int] | None = None) -> dict[str, np.ndarray] | None:
        """The chunk's arrays, or None when it is not cached or unusable (then it is deleted, with a warning)."""
        path = self._path(chunk)
        if not path.exists():
            return None
        try:
            with np.load(path) as stored:
                arrays = {name: stored[name] for name in stored.files}
            problem = _chunk_problem(arrays, expected_rows)
            if problem is None:
                problem = self._fingerprint_problem(chunk, arrays)
        except (zipfile.BadZipFile, EOFError, OSError, ValueError, KeyError) as error:
            problem = f"cannot be read back, truncated or damaged ({type(error).__name__}: {error})"
        if problem is None:
            return arrays
        rows = "" if expected_rows is None else f" ({_rows_preview(expected_rows)})"
        logger.warning(
            "score cache chunk %d (%s) %s; discarding it and scoring its rows again%s", chunk, path, problem, rows
        )
        path.unlink(missing_ok=True)
        return None

    def _fingerprint_problem(self, chunk: int, arrays: dict[str, np.ndarray]) -> str | None:
        expected = self.inputs_fingerprint(chunk, arrays["rows"])
        if "inputs" not in arrays:
            return "records no fingerprint of its inputs (written by an older kinfolk)"
        if str(arrays["inputs"]) != expected:
            return (
                f"was computed from other inputs (its fingerprint {arrays['inputs']} is not this cache's {expected})"
            )
        return None

    def write(self, chunk: int, **arrays: np.ndarray) -> None:
        inputs = np.str_(self.inputs_fingerprint(chunk, arrays["rows"]))
        with atomic_file(self._path(chunk), mode="wb", clean=False) as handle:
            np.savez(handle, inputs=inputs, **arrays)

    def completed(self) -> list[int]:
        """Chunks on disk (not checked: `read` checks each)."""
        return sorted(int(path.stem.split("-")[1]) for path in self.directory.glob("chunk-*.npz"))


def _rows_preview(rows: Sequence[int], shown: int = 8) -> str:
    """`3 rows: [1, 4, 9]`, the first `shown` of longer lists followed by `...`."""
    ordered = sorted(int(row) for row in rows)
    listed = ", ".join(map(str, ordered[:shown])) + (", ..." if len(ordered) > shown else "")
    return f"{len(ordered)} row{'s' * (len(ordered) != 1)}: [{listed}]"


def _chunk_problem(arrays: dict[str, np.ndarray], expected_rows: Sequence[int] | None) -> str | None:
    if not {"rows", "logprob"} <= set(arrays):
        return f"cannot be read back: it lacks rows / logprob (holds {sorted(arrays)})"
    if arrays["rows"].shape != arrays["logprob"].shape:
        return f"cannot be read back: it has {arrays['rows'].shape} rows but {arrays['logprob'].shape} log-probs"
    if expected_rows is not None and sorted(arrays["rows"].tolist()) != sorted(int(row) for row in expected_rows):
        return "holds other rows than this run's plan"
    return None
