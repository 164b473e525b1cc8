"""Train ATLAS and the baselines it is judged against, LoRA and CorDA-KPM, at the same placement and rank.

Each method adapts the same module(s) at the same rank, is trained by the same `SFTTrainer` settings on the same
target data, and is saved as a PEFT adapter under `<output_dir>/<method>` that loads onto the original base model
(`PeftModel.from_pretrained(base, dir)` after `import kinfolk`). Compare them afterwards with the same retained-KL
and target-score measurement; the paper compares at shared target-score requirements.

    python examples/atlas_comparators.py --model_name_or_path Qwen/Qwen3-8B-Base \\
        --train_dataset mbpp_train.jsonl --atlas_retained_dataset gsm8k_train.jsonl --atlas_retained_samples 2048 \\
        --atlas_layers 17 --atlas_r 16 --learning_rate 2e-4 --output_dir runs/compare --bf16

ATLAS and LoRA use 2e-4 and CorDA-KPM 4e-4 in the paper (Table 5); pass `--corda_learning_rate` to set CorDA's.
Any `SFTConfig` option works (`--max_steps`, `--per_device_train_batch_size`, ...), as does a YAML `--config`.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

from peft import get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import SFTConfig, SFTTrainer, TrlParser

import kinfolk  # noqa: F401  (registers the ATLAS PEFT type)
from kinfolk.commands.sft_atlas_options import AtlasArguments
from kinfolk.plugins.atlas_comparators import corda_kpm_model, matching_lora_config

METHODS = ("atlas", "lora", "corda_kpm")


@dataclass
class ComparisonArguments:
    model_name_or_path: str = field(metadata={"help": "Base model (Hub id or local folder)."})
    train_dataset: str = field(metadata={"help": "Target training data: Hub name, save_to_disk folder or file."})
    methods: list[str] = field(default_factory=lambda: list(METHODS), metadata={"help": f"Any of {METHODS}."})
    corda_learning_rate: float | None = field(default=None, metadata={"help": "CorDA-KPM's own learning rate."})


def load_rows(path: str):
    return AtlasArguments(atlas_retained_dataset=path).retained_dataset()


def build(method: str, base, atlas_args: AtlasArguments, tokenizer, output_dir: Path):
    """The PEFT model of one method, ready to train (the ATLAS atlas and CorDA's init fitted on retained data)."""
    atlas_config = atlas_args.peft_config()
    if method == "atlas":
        model = get_peft_model(base, atlas_config)
        atlas_args.fit(model, tokenizer)
        return model
    if method == "lora":
        return get_peft_model(base, matching_lora_config(base, atlas_config))
    if method == "corda_kpm":
        model = corda_kpm_model(
            base, atlas_config, atlas_args.retained_dataset(), tokenizer, max_length=atlas_args.atlas_fit_max_length
        )
        model.save_pretrained(output_dir / "corda_kpm-init")
        return model
    raise ValueError(f"unknown method {method!r}; choose from {METHODS}")


def main(argv: list[str] | None = None) -> dict[str, dict]:
    comparison, atlas_args, training = TrlParser(
        (ComparisonArguments, AtlasArguments, SFTConfig)
    ).parse_args_and_config(argv)
    tokenizer = AutoTokenizer.from_pretrained(comparison.model_name_or_path)
    train = load_rows(comparison.train_dataset)
    output_dir = Path(training.output_dir)
    summary = {}
    for method in comparison.methods:
        base = AutoModelForCausalLM.from_pretrained(comparison.model_name_or_path, dtype="auto")
        model = build(method, base, atlas_args, tokenizer, output_dir)
        args = dataclasses.replace(training, output_dir=str(output_dir / f"{method}-run"))
        if method == "corda_kpm" and comparison.corda_learning_rate is not None:
            args = dataclasses.replace(args, learning_rate=comparison.corda_learning_rate)
        trainer = SFTTrainer(model=model, args=args, train_dataset=train, processing_class=tokenizer)
        trainer.train()
        save_kwargs = {}
        if method == "corda_kpm":
            save_kwargs["path_initial_model_for_weight_conversion"] = str(output_dir / "corda_kpm-init")
        model.save_pretrained(output_dir / method, **save_kwargs)
        summary[method] = {
            "trainable_parameters": sum(p.numel() for p in model.parameters() if p.requires_grad),
            "targets": sorted(model.base_model.targeted_module_names),
            "adapter": str(output_dir / method),
        }
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
