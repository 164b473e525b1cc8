"""`AtlasArguments`: the ATLAS options of a TRL-style training script, as `TrlParser`/YAML fields.

TRL's scripts take LoRA as `--use_peft --lora_r 16 ...` (its `ModelConfig`); an ATLAS run takes
`--use_atlas --atlas_retained_dataset gsm8k.jsonl --atlas_layers 17 --atlas_r 16 --atlas_residual atlas
--atlas_regions 16`, or the same keys in the YAML config. `peft_config()` gives the `AtlasConfig` for the trainer's
`peft_config=`; `fit(model, tokenizer)` fills the atlas from the retained data before training. `kinfolk sft` takes
these options through its extension hooks (`sft_peft_config`, `sft_check`, `sft_prepare`), so an ATLAS run is one command:

    kinfolk sft --config run.yaml   # run.yaml: model, dataset, SFT options, use_atlas: true, atlas_* keys

>>> args = AtlasArguments(use_atlas=True, atlas_layers=[17], atlas_r=16, atlas_regions=1)
>>> config = args.peft_config()
>>> config.layers_to_transform, config.r, config.num_regions, config.residual
([17], 16, 1, 'atlas')
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from kinfolk.errors import InputError
from kinfolk.plugins.atlas.config import ATLAS_DTYPES, RESIDUALS, AtlasConfig


@dataclass
class AtlasArguments:
    use_atlas: bool = field(default=False, metadata={"help": "Train an ATLAS adapter (instead of LoRA/full)."})
    atlas_retained_dataset: str | None = field(
        default=None,
        metadata={
            "help": "Retained data the atlas is fitted on: a Hub dataset name, a data or `save_to_disk` folder or a "
            ".json/.jsonl/.csv/.parquet/.txt file (text, prompt/completion or messages rows). Default in `kinfolk "
            "sft`: the Replay/Output-KL `retained_dataset_name`."
        },
    )
    atlas_retained_config: str | None = field(default=None, metadata={"help": "Dataset config name, if any."})
    atlas_retained_split: str = field(default="train", metadata={"help": "Split of the retained dataset."})
    atlas_retained_samples: int | None = field(
        default=None, metadata={"help": "Use the first N retained rows (the paper fits on 2,048)."}
    )
    atlas_layers: list[int] | None = field(
        default=None,
        metadata={
            "help": "Decoder layers to adapt; default: the one at 17/36 of the depth (the paper's layer 17 of 36)."
        },
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

    def retained_dataset(self, fallback: str | None = None, fallback_split: str = "train"):
        """The retained rows, loaded as `kinfolk sft` loads its data (Hub name, folder, `save_to_disk` folder or a
        single file); `fallback` (e.g. the Replay/Output-KL `retained_dataset_name`) when none is set."""
        from kinfolk.data import load_data

        name, split = self.atlas_retained_dataset, self.atlas_retained_split
        if name is None:
            name, split = fallback, fallback_split
        if name is None:
            raise InputError(
                "--use_atlas needs retained data to fit the atlas on: --atlas_retained_dataset (or the Replay/"
                "Output-KL --retained_dataset_name, which it then shares, as in the paper)"
            )
        dataset = load_data(name, split, self.atlas_retained_config)
        if self.atlas_retained_samples is not None:
            dataset = dataset.select(range(min(self.atlas_retained_samples, len(dataset))))
        return dataset

    def fit(self, model, tokenizer, progress: bool = True, retained=None):
        """Fit the adapter's atlas on the retained data (after the trainer has wrapped the model)."""
        from kinfolk.plugins.atlas.fit import fit_atlas

        return fit_atlas(
            model,
            self.retained_dataset() if retained is None else retained,
            tokenizer=tokenizer,
            batch_size=self.atlas_fit_batch_size,
            max_length=self.atlas_fit_max_length,
            mask_prompt=self.atlas_mask_prompt,
            seed=self.atlas_seed,
            progress=progress,
        )


def sft_peft_config(options: AtlasArguments, model_args=None) -> AtlasConfig | None:
    """`kinfolk sft` hook: the adapter to train when `--use_atlas` is given."""
    return options.peft_config() if options.use_atlas else None


def _retained_for_sft(options: AtlasArguments, args) -> Any:
    """The retained rows an ATLAS run of `kinfolk sft` fits on: `--atlas_retained_dataset` or else the trainer's
    `--retained_dataset_name`; None without `--use_atlas`, or for the plain residual (which ignores the atlas and
    may run without data) when neither is given."""
    if not options.use_atlas:
        return None
    fallback = getattr(args, "retained_dataset_name", None)
    if options.atlas_residual == "plain" and options.atlas_retained_dataset is None and fallback is None:
        return None
    return options.retained_dataset(fallback, getattr(args, "retained_dataset_split", "train"))


def sft_check(options: AtlasArguments, args) -> None:
    """`kinfolk sft` hook, before the model loads: the adapter's options are valid and the retained data the atlas
    needs is given and readable, with rows (refused then, not after the model is built)."""
    if options.use_atlas:
        options.peft_config()
    _retained_for_sft(options, args)


def sft_prepare(options: AtlasArguments, trainer) -> None:
    """`kinfolk sft` hook: fit the atlas on the built trainer's model before training (`_retained_for_sft`). Under
    several processes they fit one atlas together, each running the model on its share of the retained rows."""
    retained = _retained_for_sft(options, trainer.args)
    if retained is not None:
        report = options.fit(
            trainer.model, trainer.processing_class, trainer.accelerator.is_local_main_process, retained
        )
        shares = f" across {len(report.rank_rows)} processes (rows per process {report.rank_rows})"
        trainer.accelerator.print(
            f"ATLAS: atlas fitted on {report.tokens} retained tokens{shares if len(report.rank_rows) > 1 else ''}"
            f" in {report.seconds:.1f} s"
        )
