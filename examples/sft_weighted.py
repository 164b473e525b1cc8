# TRL's `trl/scripts/sft.py` with the trainer swapped for kinfolk's WeightedSFTTrainer: the same flags and YAML
# keys, plus the weight options (`--weight_column`, `--weight_reduction`, `--prompt_loss_weight`, ...), and
# `--dataset_name` read by `kinfolk.data.load_splits`, which also takes what `kinfolk score --out` writes
# (a .jsonl or .parquet file, or a `save_to_disk` folder).
"""
Full fine-tuning on a dataset with a `weight` column (e.g. written by the ATLANTIS scoring step):

```bash
accelerate launch examples/sft_weighted.py --config examples/sft_weighted.yaml
```

LoRA, with prompt tokens at a tenth of the weight of the answer:

```bash
accelerate launch examples/sft_weighted.py \
    --model_name_or_path Qwen/Qwen2.5-0.5B \
    --dataset_name scored.jsonl \
    --weight_column weight \
    --prompt_loss_weight 0.1 \
    --learning_rate 2.0e-4 \
    --per_device_train_batch_size 2 \
    --gradient_accumulation_steps 8 \
    --use_peft \
    --lora_r 32 \
    --lora_alpha 16 \
    --output_dir Qwen2.5-0.5B-WeightedSFT
```
"""

import argparse

from kinfolk.process_group import end_training


def main(script_args, training_args, model_args, dataset_args):
    from accelerate.logging import get_logger
    from trl import get_dataset, get_peft_config, get_quantization_config

    from kinfolk.data import load_splits
    from kinfolk.trainers import WeightedSFTTrainer

    logger = get_logger(__name__)

    model_init_kwargs = dict(
        revision=model_args.model_revision,
        trust_remote_code=training_args.trust_remote_code,
        attn_implementation=model_args.attn_implementation,
        dtype=model_args.dtype,
    )
    if training_args.model_init_kwargs is not None:
        model_init_kwargs.update(training_args.model_init_kwargs)
    training_args.model_init_kwargs = model_init_kwargs

    # Load the dataset
    if dataset_args.datasets and script_args.dataset_name:
        logger.warning("Both `datasets` and `dataset_name` are provided; `datasets` is used.")
        dataset = get_dataset(dataset_args)
    elif dataset_args.datasets:
        dataset = get_dataset(dataset_args)
    elif script_args.dataset_name:
        dataset = load_splits(
            script_args.dataset_name,
            script_args.dataset_config,
            script_args.dataset_streaming,
            split=script_args.dataset_train_split,
        )
    else:
        raise ValueError("Either `datasets` or `dataset_name` must be provided.")

    # The only change from TRL's script: the trainer class (and its config, in the parser below)
    trainer = WeightedSFTTrainer(
        model=model_args.model_name_or_path,
        args=training_args,
        train_dataset=dataset[script_args.dataset_train_split],
        eval_dataset=dataset[script_args.dataset_test_split] if training_args.eval_strategy != "no" else None,
        quantization_config=get_quantization_config(model_args),
        peft_config=get_peft_config(model_args),
    )

    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    trainer.accelerator.print("Training completed.")

    trainer.save_model(training_args.output_dir)
    trainer.accelerator.print(f"Model saved to {training_args.output_dir}.")

    if training_args.push_to_hub:
        trainer.push_to_hub(dataset_name=script_args.dataset_name)
    end_training(trainer)  # every rank waits for the others, then the group goes (kinfolk.process_group)


def make_parser(subparsers: argparse._SubParsersAction | None = None, prog: str | None = None):
    from trl import DatasetMixtureConfig, ModelConfig, ScriptArguments, TrlParser

    from kinfolk.trainers import WeightedSFTConfig

    dataclass_types = (ScriptArguments, WeightedSFTConfig, ModelConfig, DatasetMixtureConfig)
    if subparsers is not None:
        return subparsers.add_parser("sft-weighted", help="Weighted SFT", dataclass_types=dataclass_types)
    return TrlParser(dataclass_types, prog=prog)


if __name__ == "__main__":
    parser = make_parser()
    script_args, training_args, model_args, dataset_args = parser.parse_args_and_config(fail_with_unknown_args=False)
    main(script_args, training_args, model_args, dataset_args)
