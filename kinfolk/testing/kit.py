"""`TinyKit`: a directory of tiny model families built on demand and reused.

Every model directory holds safetensors weights and the shared tokenizer, so code under test loads it with
`AutoModelForCausalLM.from_pretrained(path)` exactly as it would a real checkpoint.

>>> import tempfile
>>> from kinfolk.testing import TinyKit
>>> kit = TinyKit(tempfile.mkdtemp())
>>> family = kit.family("llama")
>>> sorted(family)
['large_base', 'small_base', 'small_instruct']
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from transformers import AutoTokenizer, PreTrainedTokenizerBase

from kinfolk.testing.models import build_model, perturbed_copy, save_model
from kinfolk.testing.tokenizer import build_tokenizer, save_tokenizer


class TinyKit:
    """Builds (once) and returns paths of tiny models under `root`; safe to share across tests in one process."""

    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    @property
    def tokenizer_dir(self) -> Path:
        directory = self.root / "tokenizer"
        if not (directory / "tokenizer.json").exists():
            save_tokenizer(build_tokenizer(), self._scratch(directory))
            self._publish(directory)
        return directory

    def tokenizer(self) -> PreTrainedTokenizerBase:
        return AutoTokenizer.from_pretrained(self.tokenizer_dir)

    def model_dir(self, architecture: str, size: str = "small", seed: int = 0, sharded: bool = False) -> Path:
        """A saved random model; `sharded=True` splits its weights over several safetensors files with an index."""
        name = f"{architecture}-{size}-s{seed}" + ("-sharded" if sharded else "")
        directory = self.root / name
        if not (directory / "config.json").exists():
            tokenizer = self.tokenizer()
            model = build_model(architecture, size, seed=seed, tokenizer=tokenizer)
            save_model(model, tokenizer, self._scratch(directory), max_shard_size="40KB" if sharded else None)
            self._publish(directory)
        return directory

    def family(self, architecture: str, seed: int = 0) -> dict[str, Path]:
        """Small base, its "instruct" sibling (a seeded perturbation of it) and a large base of one family."""
        small = self.model_dir(architecture, "small", seed)
        instruct = self.root / f"{architecture}-small-s{seed}-instruct"
        if not (instruct / "config.json").exists():
            from transformers import AutoModelForCausalLM

            base = AutoModelForCausalLM.from_pretrained(small)
            save_model(perturbed_copy(base, seed=seed + 1), self.tokenizer(), self._scratch(instruct))
            self._publish(instruct)
        return {
            "small_base": small,
            "small_instruct": instruct,
            "large_base": self.model_dir(architecture, "large", seed),
        }

    # A model directory appears only complete: each process builds beside the final name and renames into
    # place; when parallel test workers race, the first rename wins and the others discard their copy.
    def _scratch(self, directory: Path) -> Path:
        scratch = directory.with_name(f"{directory.name}.partial-{os.getpid()}")
        shutil.rmtree(scratch, ignore_errors=True)
        return scratch

    def _publish(self, directory: Path) -> None:
        scratch = directory.with_name(f"{directory.name}.partial-{os.getpid()}")
        try:
            scratch.rename(directory)
        except OSError:
            if not directory.exists():
                raise
            shutil.rmtree(scratch, ignore_errors=True)
