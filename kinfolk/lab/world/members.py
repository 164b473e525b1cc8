"""How each model of a lab family comes to be: its config, its training run, and reuse of an identical model.

A model's lineage (`lineage.json` in its directory: its model key and the steps it was trained for) lets a family
reuse a model that another family of the cache already trained with the same key (`trained_or_reused`), so
families that differ only in a later stage share their bases bit for bit.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, PreTrainedModel

from kinfolk import console
from kinfolk.atomic import atomic_directory, write_json
from kinfolk.lab.world.evaluate import StopWhenLearned
from kinfolk.lab.world.tokenizer import MAX_LENGTH
from kinfolk.lab.world.training import lab_trainer, save_model
from kinfolk.testing.models import tiny_config

LINEAGE_FILE = "lineage.json"  # in each model directory: its model key and the steps it was trained for


def say(message: str, progress: bool) -> None:
    if progress:
        console.stage(message, "kinfolk lab")


def model_config(shape: dict, tokenizer):
    heads = 4
    return tiny_config(
        "llama",
        vocab_size=len(tokenizer),
        num_attention_heads=heads,
        num_key_value_heads=heads,
        head_dim=shape["hidden_size"] // heads,
        initializer_range=0.02,
        max_position_embeddings=MAX_LENGTH,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
        **shape,
    )


def train(
    model,
    dataset: Dataset,
    tokenizer,
    out: Path,
    steps: int,
    learning_rate: float,
    config,
    progress: bool = True,
    until: dict | None = None,
    prepared: dict[str, Dataset] | None = None,
) -> int:
    """Train one family member with the lab's recipe (`training.lab_trainer`), at most `steps` steps or until the
    `until` rule holds (`StopWhenLearned`), and save it atomically to `out`; returns the steps trained. Members
    sharing `prepared` prepare rows they share once (`kinfolk.lab.world.prepared`)."""
    with tempfile.TemporaryDirectory() as scratch:
        trainer = lab_trainer(
            model,
            dataset,
            tokenizer,
            scratch,
            steps,
            learning_rate,
            batch_size=config.batch_size,
            prompt_loss_weight=config.prompt_loss_weight,
            seed=config.seed,
            progress=progress,
            prepared=prepared,
        )
        if until:
            report = (lambda message: say(message, True)) if progress else None
            trainer.add_callback(StopWhenLearned(tokenizer, seed=config.seed, report=report, **until))
        trainer.train()
    save_model(trainer.model, tokenizer, out)
    return trainer.state.global_step


def lineage(model_dir: Path) -> dict | None:
    path = model_dir / LINEAGE_FILE
    return json.loads(path.read_text()) if path.exists() and (model_dir / "config.json").exists() else None


def trained_or_reused(root: Path, name: str, config, force: bool, progress: bool, train_it, budget: str) -> int:
    """`name`'s model in `root`: already there, copied from another family of the cache with the same model key,
    or trained now (`train_it() -> steps`); returns the steps it was trained for."""
    key = config.model_key(name)
    here = lineage(root / name)
    if here and here["key"] == key and not force:
        return here["steps"]
    twin = (
        None
        if force
        else next(
            (
                d / name
                for d in sorted(root.parent.iterdir())
                if d != root and (lineage(d / name) or {}).get("key") == key
            ),
            None,
        )
    )
    if twin is not None:
        say(f"{name}: the same model (key {key}) is in {twin.parent.name}; copying it", progress)
        with atomic_directory(root / name, overwrite=True) as staging:
            shutil.copytree(twin, staging, dirs_exist_ok=True)
        return lineage(twin)["steps"]
    say(f"training {name}: {budget}", progress)
    steps = train_it()
    write_json(root / name / LINEAGE_FILE, {"key": key, "steps": steps})
    return steps


def fresh_model(shape: dict, tokenizer, seed: int) -> PreTrainedModel:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return AutoModelForCausalLM.from_config(model_config(shape, tokenizer), dtype=torch.float32)
