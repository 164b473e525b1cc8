"""`AtlasArguments`: the ATLAS options of a TRL-style training script, as `TrlParser`/YAML fields.

TRL's scripts take LoRA as `--use_peft --lora_r 16 ...` (its `ModelConfig`); an ATLAS run takes
`--use_atlas --atlas_retained_dataset gsm8k.jsonl --atlas_layers 17 --atlas_r 16 --atlas_residual atlas
--atlas_regions 16`, or the same keys in the YAML config. `peft_config()` gives the `AtlasConfig` for the trainer's
`peft_config=`; `fit(model, tokenizer)` fills the atlas from the retained data before training.

>>> args = AtlasArguments(use_atlas=True, atlas_layers=[17], atlas_r=16, atlas_regions=1)
>>> config = args.peft_config()
>>> config.layers_to_transform, config.r, config.num_regions, config.residual
([17], 16, 1, 'atlas')
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from kinfolk.plugins.atlas.config import ATLAS_DTYPES, RESIDUALS, AtlasConfig

_FILE_LOADERS = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet", ".txt": "text"}


@dataclass
class AtlasArguments:
    use_atlas: bool = field(default=False, metadata={"help": "Train an ATLAS adapter (instead of LoRA/full)."})
    atlas_retained_dataset: str | None = field(
        default=None,
        metadata={
            "help": "Retained data the atlas is fitted on: a Hub dataset name, a `save_to_disk` folder or a "
            ".json/.jsonl/.csv/.parquet/.txt file (text, prompt/completion or messages rows)."
        },
    )
    atlas_retained_config: str | None = field(default=None, metadata={"help": "Dataset config name, if any."})
    atlas_retained_split: str = field(default="train", metadata={"help": "Split of the retained dataset."})
    atlas_retained_samples: int | None = field(
        default=None, metadata={"help": "Use the first N retained rows (the paper fits on 2,048)."}
    )
    atlas_layers: list[int] | None = field(
        default=None, metadata={"help": "Decoder layers to adapt; default: the one at 47% depth."}
    )
    atlas_target_modules: list[str] | None = field(
        default=None, metadata={"help": "Modules to adapt; default: the attention output projection."}
    )
    atlas_r: int = field(default=16, metadata={"help": "Rank of the residual."})
    atlas_residual: Literal[RESIDUALS] = field(default="atlas", metadata={"help": "Residual variant (Table 14)."})
    atlas_regions: int = field(default=16, metadata={"help": "Atlas regions K (1 = Global PCA)."})
    atlas_directions: int = field(default=8, metadata={"help": "PCA directions p per region."})
    atlas_routing_temperature: float = field(default=1.0, metadata={"help": "Soft-routing temperature multiple."})
    atlas_dtype: Literal[tuple(ATLAS_DTYPES)] = field(default="float32", metadata={"help": "Atlas storage dtype."})
    atlas_mask_prompt: bool = field(default=False, metadata={"help": "Fit on completion tokens only."})
    atlas_fit_batch_size: int = field(default=8, metadata={"help": "Batch size of the fitting passes."})
    atlas_fit_max_length: int = field(default=1024, metadata={"help": "Retained rows are cut to this many tokens."})
    atlas_seed: int = field(default=0, metadata={"help": "Seed of the atlas k-means."})

    def peft_config(self) -> AtlasConfig:
        return AtlasConfig(
            r=self.atlas_r,
            residual=self.atlas_residual,
            num_regions=self.atlas_regions,
            num_directions=self.atlas_directions,
            routing_temperature=self.atlas_routing_temperature,
            atlas_dtype=self.atlas_dtype,
            target_modules=self.atlas_target_modules,
            layers_to_transform=self.atlas_layers,
            task_type="CAUSAL_LM",
        )

    def retained_dataset(self):
        """The retained rows, loaded as `trl sft` loads its training data (plus local files and folders)."""
        import datasets

        if self.atlas_retained_dataset is None:
            raise ValueError("--use_atlas needs --atlas_retained_dataset (the data the atlas is fitted on)")
        path = Path(self.atlas_retained_dataset)
        if path.is_dir() and (path / "dataset_info.json").exists():
            dataset = datasets.load_from_disk(str(path))
        elif path.suffix in _FILE_LOADERS and path.exists():
            dataset = datasets.load_dataset(_FILE_LOADERS[path.suffix], data_files=str(path), split="train")
        else:
            dataset = datasets.load_dataset(
                self.atlas_retained_dataset, self.atlas_retained_config, split=self.atlas_retained_split
            )
        if self.atlas_retained_samples is not None:
            dataset = dataset.select(range(min(self.atlas_retained_samples, len(dataset))))
        return dataset

    def fit(self, model, tokenizer, progress: bool = True):
        """Fit the adapter's atlas on the retained data (after the trainer has wrapped the model)."""
        from kinfolk.plugins.atlas.fit import fit_atlas

        return fit_atlas(
            model,
            self.retained_dataset(),
            tokenizer=tokenizer,
            batch_size=self.atlas_fit_batch_size,
            max_length=self.atlas_fit_max_length,
            mask_prompt=self.atlas_mask_prompt,
            seed=self.atlas_seed,
            progress=progress,
        )
