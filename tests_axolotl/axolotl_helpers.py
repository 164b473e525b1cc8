"""Shared set-up of the axolotl tests: tiny data files, an axolotl config of a tiny local model, and axolotl's own
config loading, data loading (plugins first, as `axolotl train` does) and trainer builder driven from Python."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
import yaml

PLUGIN = "kinfolk.integrations.axolotl.KinfolkPlugin"


def write_rows(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def alpaca_rows(weights: list[Any]) -> list[dict[str, Any]]:
    """Alpaca rows (instruction, output) with the given weights: short sums, so each row has a few answer tokens."""
    return [
        {"instruction": f"What is {index} + {2 * index + 1}?", "output": f"{3 * index + 1}", "weight": weight}
        for index, weight in enumerate(weights)
    ]


def retained_rows(count: int = 12) -> list[dict[str, str]]:
    return [{"prompt": f"Reverse the word 'w{index}x'.", "completion": f" x{index}w"} for index in range(count)]


def config(root: Path, model: Path, data: Path, **overrides: Any) -> dict[str, Any]:
    """An axolotl config of a short CPU run of `model` on alpaca rows `data`, the kinfolk plugin registered."""
    values = {
        "base_model": str(model),
        "plugins": [PLUGIN],
        "datasets": [{"path": str(data), "ds_type": "json", "type": "alpaca"}],
        "val_set_size": 0,
        "output_dir": str(root / "out"),
        "dataset_prepared_path": str(root / "prepared"),
        "sequence_len": 256,
        "micro_batch_size": 4,
        "gradient_accumulation_steps": 1,
        "max_steps": 2,
        "learning_rate": 1e-3,
        "optimizer": "adamw_torch",
        "lr_scheduler": "constant",
        "save_strategy": "no",
        "logging_steps": 1,
        "dataset_processes": 1,
        "bf16": False,
        "fp16": False,
        "seed": 0,
    }
    values.update(overrides)
    return values


def write_config(root: Path, values: dict[str, Any]) -> Path:
    path = root / "config.yaml"
    path.write_text(yaml.safe_dump(values), encoding="utf-8")
    return path


def load_config(path: Path):
    """axolotl's own config loading: plugins registered, the merged schema validated."""
    from axolotl.cli.config import load_cfg

    return load_cfg(str(path))


def load_data(cfg):
    """The datasets as `axolotl train` loads them: a plugin's `load_datasets` first, else axolotl's."""
    from axolotl.common.datasets import load_datasets
    from axolotl.integrations.base import PluginManager

    return PluginManager.get_instance().load_datasets(cfg, preprocess=False) or load_datasets(cfg=cfg)


def build_trainer(cfg):
    """axolotl's model loading and trainer builder (`setup_model_and_trainer`), with the datasets above."""
    from axolotl.train import setup_model_and_trainer

    trainer, model, tokenizer, _, _ = setup_model_and_trainer(cfg, load_data(cfg))
    return trainer, model, tokenizer


def first_batch(trainer) -> dict[str, torch.Tensor]:
    return next(iter(trainer.get_train_dataloader()))
