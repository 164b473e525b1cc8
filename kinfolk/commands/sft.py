"""`kinfolk sft`: the `trl sft` command with `WeightedSFTTrainer`.

Same parser (`TrlParser` over TRL's `ScriptArguments`, the SFT config, `ModelConfig`, `DatasetMixtureConfig`), same
flags, same YAML keys (`--config run.yaml`), plus the weight options of `WeightedSFTConfig`; arguments neither
knows go to `accelerate launch`, which starts this module on every process, exactly as `trl sft` does:

    kinfolk sft --config run.yaml --num_processes 2            # any `accelerate launch` flag, or its YAML key
    kinfolk sft --model_name_or_path Qwen/Qwen2.5-0.5B --dataset_name ./weighted \\
        --weight_column weight --prompt_loss_weight 0.1 --use_peft --lora_r 16 --output_dir out

`--dataset_name` also takes what `kinfolk score --out` writes (a .jsonl or .parquet file, or a `save_to_disk`
folder): anything `kinfolk.data.load_splits` reads.

Other components add option groups (`SFTExtension`): a dataclass parsed with the rest (flags and YAML keys), a hook
that turns the parsed options into the `peft_config` to train, a hook that checks the extension's own inputs before
the model loads, and a hook that runs on the built trainer before training (e.g. to fit data-dependent adapter
state). Append one to `EXTENSIONS`.

Bad input is refused before the model loads where it can be (`check_inputs`: the model, `--output_dir`,
`--resume_from_checkpoint` and, for an adapter run, that its adapter fits the model; the data's splits, columns,
rows and weights; each extension's `check`; the adapter built on the model's empty modules, so that PEFT's refusal
of `--lora_target_modules` is one line), else before training.

>>> parser = make_parser()
>>> script_args, training_args, model_args, dataset_args, *extension_args = parser.parse_args_and_config(
...     ["--output_dir", "out", "--use_cpu", "--weight_reduction", "sequence", "--dataset_name", "data"]
... )
>>> training_args.weight_reduction, script_args.dataset_name
('sequence', 'data')
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trl import DatasetMixtureConfig, ModelConfig, ScriptArguments

from kinfolk.atomic import check_writable
from kinfolk.commands.launching import (
    check_launch_arguments,
    check_resume_checkpoint,
    checkpoints_at_once,
    last_checkpoint,
    launch,
    remove_tree,
    resume_from_last_checkpoint,
    say_resumed,
)
from kinfolk.commands.parsing import VerbParser
from kinfolk.commands.sft_atlas_options import AtlasArguments, sft_check, sft_peft_config, sft_prepare
from kinfolk.data import load_splits, naming, select_split
from kinfolk.diskspace import check_free_space
from kinfolk.errors import InputError, OutputExistsError
from kinfolk.hints import suggest
from kinfolk.interrupt import keep
from kinfolk.process_group import end_training
from kinfolk.trainers.weighted_sft_config import WeightedSFTConfig

OVERWRITE_HINT, RESUME_HINT = suggest("--overwrite", "sft"), suggest("--resume_from_checkpoint", "sft")

PROG = "kinfolk sft"


@dataclass(frozen=True)
class SFTExtension:
    """An option group of `kinfolk sft`.

    `arguments` is a dataclass (fields with `metadata={"help": ...}`) parsed beside TRL's; `peft_config(options,
    model_args)` may return the `PeftConfig` to train (at most one source of adapters per run); `check(options,
    training_args)` refuses bad input of the extension's own before the model loads; `prepare(options, trainer)`
    runs once the trainer is built, before training. `options` names the flags that place its adapter, for a
    refusal of the adapter by PEFT (found on the model's empty modules before its weights load).
    """

    arguments: type
    peft_config: Callable[[Any, ModelConfig], Any] | None = None
    check: Callable[[Any, Any], None] | None = None
    prepare: Callable[[Any, Any], None] | None = None
    options: str = ""


@dataclass
class OutputArguments:
    overwrite: bool = field(
        default=False,
        metadata={
            "help": "Remove an existing non-empty --output_dir before training (without it, kinfolk sft refuses one "
            "unless --resume_from_checkpoint continues it)."
        },
    )


def check_output_dir(options: OutputArguments, training_args) -> None:
    """Refuse a non-empty `--output_dir` unless resuming or `--overwrite`: a new run would write its checkpoints
    beside the old run's, and a later resume would pick up whichever is the last."""
    output_dir = Path(training_args.output_dir)
    resuming = training_args.resume_from_checkpoint is not None
    if options.overwrite or resuming or not output_dir.is_dir() or not any(output_dir.iterdir()):
        return
    raise OutputExistsError(
        f"--output_dir {output_dir} already holds a run; pass {OVERWRITE_HINT} to replace it or "
        f"{RESUME_HINT} to continue it",
        path=output_dir,
    )


# Option groups parsed alongside TRL's.
EXTENSIONS: list[SFTExtension] = [
    SFTExtension(
        arguments=AtlasArguments,
        peft_config=sft_peft_config,
        check=sft_check,
        prepare=sft_prepare,
        options="--use_atlas (--atlas_target_modules, --atlas_layers, --atlas_r)",
    ),
    SFTExtension(arguments=OutputArguments, check=check_output_dir),
]


def make_parser(prog: str = PROG) -> VerbParser:
    dataclass_types = (ScriptArguments, WeightedSFTConfig, ModelConfig, DatasetMixtureConfig)
    return VerbParser((*dataclass_types, *(extension.arguments for extension in EXTENSIONS)), prog=prog)


def load_datasets(script_args: ScriptArguments, dataset_args: DatasetMixtureConfig):
    """The dataset splits as `trl sft` loads them, plus local data files and `save_to_disk` folders."""
    from trl import get_dataset

    if dataset_args.datasets:
        return get_dataset(dataset_args)
    if not script_args.dataset_name:
        raise InputError("either --datasets (in --config) or --dataset_name must be given")
    return load_splits(
        script_args.dataset_name,
        script_args.dataset_config,
        script_args.dataset_streaming,
        split=script_args.dataset_train_split,
    )


def build_peft_config(model_args: ModelConfig, extension_options: tuple) -> Any:
    """The one adapter to train: TRL's `--use_peft` LoRA or an extension's; None for full fine-tuning."""
    return chosen_adapter(model_args, extension_options)[1]


def chosen_adapter(model_args: ModelConfig, extension_options: tuple) -> tuple[str, Any]:
    """(the options that asked for it, the `PeftConfig`) of the one adapter to train; ("", None) for full
    fine-tuning."""
    from trl import get_peft_config

    candidates = [("--use_peft", lora_options(model_args), get_peft_config(model_args))]
    for extension, options in zip(EXTENSIONS, extension_options):
        if extension.peft_config is not None:
            label = extension.options or extension.arguments.__name__
            candidates.append((extension.arguments.__name__, label, extension.peft_config(options, model_args)))
    chosen = [(source, label, config) for source, label, config in candidates if config is not None]
    if len(chosen) > 1:
        sources = ", ".join(source for source, _, _ in chosen)
        raise InputError(f"several adapters were requested ({sources}); choose one")
    return chosen[0][1:] if chosen else ("", None)


def lora_options(model_args: ModelConfig) -> str:
    """How `--use_peft`'s adapter was placed, as typed."""
    targets = model_args.lora_target_modules
    shown = " ".join(targets) if isinstance(targets, list) else targets
    return "--use_peft" + (f" --lora_target_modules {shown}" if targets is not None else "")


def lora_hint(model_args: ModelConfig) -> str:
    """TRL passes one `--lora_target_modules` value to PEFT as a string, which PEFT reads as a regular expression
    over whole module names: `o_proj` then matches no module of a transformer. Said when PEFT refuses it."""
    targets = model_args.lora_target_modules
    if not isinstance(targets, str) or targets == "all-linear":
        return ""
    return (
        f"a single --lora_target_modules value is a regular expression matched against whole module names such as "
        f"model.layers.0.self_attn.o_proj: write '.*{targets}', or name two or more modules"
    )


def check_adapter_placement(model_args: ModelConfig, training_args, extension_options: tuple) -> Any:
    """The adapter to train (`chosen_adapter`), built first on the model's empty modules: what PEFT refuses (no
    module matches, a layer the model lacks, a rank too wide) is one line naming the option, before the weights
    load (`kinfolk.adapter_checks.check_adapter_on_empty_model`)."""
    from kinfolk.adapter_checks import check_adapter_on_empty_model

    options, peft_config = chosen_adapter(model_args, extension_options)
    if peft_config is not None:
        hint = lora_hint(model_args) if options.startswith("--use_peft") else ""
        model = model_args.model_name_or_path
        check_adapter_on_empty_model(peft_config, model, options, hint, training_args.trust_remote_code)
    return peft_config


def check_inputs(script_args, training_args, model_args) -> None:
    """Refuse, before loading the model or the data, what would fail later: a model directory that cannot load,
    an `--output_dir` that cannot be written (found at the first checkpoint, hours in) and a
    `--resume_from_checkpoint` directory that is not there (for "true": no checkpoint in `--output_dir`) or holds
    an adapter made on another model (`kinfolk.adapter_checks.check_adapter_fits_base`)."""
    from kinfolk.adapter_checks import check_adapter_fits_base
    from kinfolk.inputs import check_model

    if model_args.model_name_or_path is None:
        raise InputError("--model_name_or_path is required")
    check_model(model_args.model_name_or_path, "the --model_name_or_path", tokenizer=True)
    check_writable(Path(training_args.output_dir) / "checkpoint")
    resume = last_checkpoint(training_args.resume_from_checkpoint, training_args.output_dir)
    if resume is not None:
        check_resume_checkpoint(resume)
        # an adapter run's checkpoint holds the adapter, which must fit this model (headers only)
        check_adapter_fits_base(resume, model_args.model_name_or_path, "the --resume_from_checkpoint adapter")


def train(script_args, training_args, model_args, dataset_args, *extension_options):
    """What each launched process runs: `trl sft`'s script with WeightedSFTTrainer and the extensions' hooks."""
    from trl import get_quantization_config

    from kinfolk.trainers.weighted_sft_trainer import WeightedSFTTrainer

    training_args.model_init_kwargs = {
        "revision": model_args.model_revision,
        "trust_remote_code": training_args.trust_remote_code,
        "attn_implementation": model_args.attn_implementation,
        "dtype": model_args.dtype,
        **(training_args.model_init_kwargs or {}),
    }
    check_inputs(script_args, training_args, model_args)
    for extension, options in zip(EXTENSIONS, extension_options):
        if extension.check is not None:
            extension.check(options, training_args)
    dataset = load_datasets(script_args, dataset_args)
    peft_config = check_adapter_placement(model_args, training_args, extension_options)
    source = script_args.dataset_name or "the --datasets mixture"
    evaluating = training_args.eval_strategy != "no"
    with naming(source):  # a missing or bad weight column, or columns TRL cannot train on, name the data
        trainer = WeightedSFTTrainer(
            model=model_args.model_name_or_path,
            args=training_args,
            train_dataset=select_split(dataset, script_args.dataset_train_split, source),
            eval_dataset=select_split(dataset, script_args.dataset_test_split, source) if evaluating else None,
            quantization_config=get_quantization_config(model_args),
            peft_config=peft_config,
        )
    for extension, options in zip(EXTENSIONS, extension_options):
        if extension.prepare is not None:
            extension.prepare(options, trainer)
    trainer.train(
        resume_from_checkpoint=last_checkpoint(training_args.resume_from_checkpoint, training_args.output_dir)
    )
    trainer.save_model(training_args.output_dir)
    trainer.accelerator.print(f"Model saved to {training_args.output_dir}.")
    if training_args.push_to_hub:
        trainer.push_to_hub(dataset_name=script_args.dataset_name)
    end_training(trainer)  # every rank waits for the others, then the group goes (kinfolk.process_group)
    return trainer


def main(argv: list[str] | None = None) -> int:
    """The verb: parse here (for `--help` and early errors), then start `accelerate launch` on this module."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = make_parser()
    parsed, config_remaining, cli_remaining = parser.parse_with_rest(argv)
    check_launch_arguments(PROG, argv, config_remaining, cli_remaining, parser.option_names())
    training_args = parsed[1]
    output_options = next((group for group in parsed if isinstance(group, OutputArguments)), OutputArguments())
    check_output_dir(output_options, training_args)
    output_dir = Path(training_args.output_dir)
    check_writable(output_dir / "checkpoint")  # here, before any process starts; `check_inputs` runs in each
    adapter = parsed[2].use_peft or any(getattr(group, "use_atlas", False) for group in parsed)
    needed = full_fine_tuning_bytes(parsed[2].model_name_or_path, training_args) if not adapter else None
    if needed is not None:
        check_free_space(output_dir, needed, "the fine-tuned model and its checkpoints")
    if output_options.overwrite and training_args.resume_from_checkpoint is None and output_dir.is_dir():
        remove_tree(output_dir)
    keep(f"the published checkpoints under {output_dir}", resume_from_last_checkpoint)
    say_resumed(PROG, training_args, output_dir)
    return launch(__name__, argv, config_remaining, cli_remaining)


def full_fine_tuning_bytes(model: str | None, training_args) -> int | None:
    """What a full fine-tuning run writes under `--output_dir`: the model and each checkpoint kept at once
    (weights and Adam's two moments), all fp32, from the parameter count in the model's safetensors headers. None
    for a model that is not a local directory. (An adapter's checkpoints are small beside its base: not estimated.)"""
    from math import prod

    from kinfolk.tensors import TensorReader

    if model is None or not Path(model).is_dir():
        return None
    reader = TensorReader(model)
    parameters = sum(prod(reader.shape_and_dtype(name)[0]) for name in reader.names())
    return 4 * parameters * (1 + 3 * checkpoints_at_once(training_args))


def launched(argv: list[str]) -> int:
    """What `accelerate launch` runs on each process (its own flags already taken out)."""
    train(*make_parser().parse_args_and_config(argv, fail_with_unknown_args=False))
    return 0


if __name__ == "__main__":
    from kinfolk.commands import run

    sys.exit(run(PROG, lambda: launched(sys.argv[1:])))
