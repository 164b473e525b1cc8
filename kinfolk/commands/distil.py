"""`kinfolk distil`: ADAPT's distillation from a teacher and a layer selection to a distilled student and its delta.

One command for the three steps the ADAPT pipeline runs per teacher (`kinfolk.plugins.adapt.distillation`: the
merges of `kinfolk merge` around the `LayerDistillationTrainer` of `kinfolk.trainers`), written under `--out`:

    OUT/init-student/   `kinfolk merge init-student`: the teacher's layers of `--layers` (default: every other
                        layer and the last, as the paper), embeddings, norm and head; the layer map beside it
    OUT/training/       the trainer's checkpoints and logs (`--resume_from_checkpoint` continues from them)
    OUT/distilled/      the distilled student: pre-training text first (every token's CE, KL and block cosine),
                        then SFT data (response tokens only), `--pretraining_fraction` (0.5) of `--max_steps` on
                        the first, one learning-rate schedule (ADAPT §3.2)
    OUT/delta/          `kinfolk merge delta`: distilled − init, for `kinfolk merge apply-delta` on each variant

Options are `LayerDistillationConfig`'s (every `trl sft` training flag and the loss weights) plus this verb's own,
from flags or `--config distil.yaml`; unknown flags go to `accelerate launch`, which starts this module on every
process, as `kinfolk sft` does. Bad input exits 2 with one line before any process starts (`prepare_out`): an
existing `--out` without `--overwrite`, a teacher that cannot load, a layer selection it does not fit, missing or
empty data or data without SFT columns, a `--resume_from_checkpoint` that is not a checkpoint; `--overwrite` clears the old output only after
those checks. Each part appears whole or not at all (`kinfolk.atomic`). The merges run on the main process only:

    kinfolk distil --teacher models/Qwen3-4B-Instruct --pretraining_data pile.jsonl --sft_data math.jsonl \\
        --max_steps 2000 --per_device_train_batch_size 8 --out students/instruct [--num_processes 8]

>>> args, training_args = make_parser().parse(["--teacher", "t", "--sft_data", "d.jsonl", "--out", "o", "--use_cpu"])
>>> layer_selection(args.layers).to_dict(), training_args.pretraining_fraction
({'every': 2, 'last': 1}, 0.5)
"""

from __future__ import annotations

import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from kinfolk import console
from kinfolk.atomic import check_destination
from kinfolk.commands.launching import (
    check_launch_arguments,
    check_resume_checkpoint,
    checkpoints_at_once,
    launch,
    remove_tree,
    resume_from_last_checkpoint,
    say_resumed,
)
from kinfolk.commands.parsing import VerbParser
from kinfolk.diskspace import check_free_space
from kinfolk.errors import InputError, LayerMapError
from kinfolk.interrupt import keep
from kinfolk.plugins.adapt.distillation import DELTA, DISTILLED, INIT, TRAINING, distil_student, layer_selection
from kinfolk.trainers.layer_distillation_config import LayerDistillationConfig

PROG = "kinfolk distil"


@dataclass
class DistilArguments:
    teacher: str | None = field(default=None, metadata={"help": "Teacher model directory (required)."})
    out: str | None = field(
        default=None, metadata={"help": "Output directory: init-student/, training/, distilled/, delta/ (required)."}
    )
    layers: str = field(
        default="{every: 2, last: 1}",
        metadata={
            "help": "Teacher layers the student keeps (YAML): {every: n, first: k, last: k} or {layers: [..]}; the "
            "default drops every other layer but keeps the last, as ADAPT does."
        },
    )
    pretraining_data: str | None = field(
        default=None,
        metadata={"help": "Pre-training rows (text, or prompt/completion trained on every token): phase 1."},
    )
    sft_data: str | None = field(
        default=None, metadata={"help": "SFT rows (prompt/completion or messages; responses trained): phase 2."}
    )
    split: str = field(default="train", metadata={"help": "Split of Hub datasets."})
    overwrite: bool = field(default=False, metadata={"help": "Replace an existing --out."})
    verbose: bool = field(default=False, metadata={"help": "Show the libraries' output (else: OUT/run.log)."})


def make_parser() -> VerbParser:
    return VerbParser((DistilArguments, LayerDistillationConfig), prog=PROG, description=__doc__.split("\n\n")[0])


def load_phases(args: DistilArguments):
    """(pre-training, SFT) datasets of `--pretraining_data` and `--sft_data` (None where not given)."""
    from kinfolk.data import load_data

    if not (args.pretraining_data or args.sft_data):
        raise InputError("give --sft_data, --pretraining_data or both (the two phases of ADAPT)")
    return tuple(load_data(path, args.split) if path else None for path in (args.pretraining_data, args.sft_data))


def distil(args: DistilArguments, training_args: LayerDistillationConfig, pretraining=None, sft=None) -> Path:
    """`kinfolk.plugins.adapt.distillation.distil_student` with this verb's arguments; the command reads the
    datasets with `load_phases`."""
    return distil_student(args.teacher, args.out, args.layers, training_args, pretraining, sft)


def check_arguments(args: DistilArguments, training_args: LayerDistillationConfig) -> Path:
    """The checks that read no model and no data (so they run before any log opens, and a refusal reaches the
    terminal alone): the required options, the layer selection's form, an existing or unwritable `--out` and a
    `--resume_from_checkpoint` that is not a checkpoint."""
    if not args.teacher or not args.out:  # checked here, after the parse has named any unknown option
        raise InputError("--teacher and --out are required")
    if not (args.pretraining_data or args.sft_data):
        raise InputError("give --sft_data, --pretraining_data or both (the two phases of ADAPT)")
    layer_selection(args.layers)
    out = Path(args.out)
    resume = training_args.resume_from_checkpoint
    if resume is None:
        check_destination(out, args.overwrite)
    elif isinstance(resume, str) and resume.lower() != "true":  # "true": the last checkpoint under --out
        check_resume_checkpoint(resume)
    return out


def check_sources(args: DistilArguments, training_args: LayerDistillationConfig, out: Path) -> None:
    """The checks that read the teacher and the data (the libraries print as they load them): a teacher that cannot
    load, a layer selection that does not fit it, data that is missing, empty, unreadable or without SFT columns
    (`check_phases`), and too little free space under `out`."""
    from kinfolk.inputs import check_model

    teacher = check_model(args.teacher, "the --teacher", tokenizer=True)
    try:
        layer_selection(args.layers).resolve(teacher.get_text_config().num_hidden_layers)
    except LayerMapError as error:
        raise LayerMapError(f"--layers: {error} (teacher {args.teacher})") from None
    check_phases(args, training_args)
    check_free_space(out, distil_bytes(args, training_args), "the student, its checkpoints and its delta")


def check_phases(args: DistilArguments, training_args: LayerDistillationConfig) -> None:
    """Read both phases' data once here (the processes reuse the cache) and refuse one that has no rows or none of
    the SFT column sets, naming the option and file: before any process starts, and not only once the init-student
    merge and the teacher's load are done."""
    from kinfolk.errors import DatasetFormatError, EmptyDatasetError
    from kinfolk.tokens import dataset_type

    options = {"--pretraining_data": args.pretraining_data, "--sft_data": args.sft_data}
    for (option, path), dataset in zip(options.items(), load_phases(args)):
        if dataset is None:
            continue
        if len(dataset) == 0:
            raise EmptyDatasetError(f"{option} {path} holds no rows")
        try:
            dataset_type(dataset.column_names, training_args.dataset_text_field)
        except DatasetFormatError as error:
            raise DatasetFormatError(f"{option} {path}: {error}") from None


def distil_bytes(args: DistilArguments, training_args: LayerDistillationConfig) -> int:
    """An estimate of what a run writes under `--out`: the student three times (init-student, distilled, delta,
    from the init-student plan) and each checkpoint kept at once as three students (weights and Adam's two
    moments), `save_total_limit` of them (+1 being published) or one per save of `max_steps`."""
    from kinfolk.plugins.adapt import InitStudentConfig
    from kinfolk.plugins.adapt.plan import build_plan

    plan = build_plan(InitStudentConfig(teacher=args.teacher, layers=layer_selection(args.layers)))
    student = sum(model.nbytes for model in plan.models)
    return student * (3 + 3 * checkpoints_at_once(training_args))


def prepare_out(args: DistilArguments, training_args: LayerDistillationConfig) -> Path:
    """Refuse, before any process starts and before `--overwrite` clears anything, what would fail later
    (`check_arguments`, then `check_sources` with the libraries' output kept off the terminal), then clear an
    existing `--out` when `--overwrite` (not when resuming from it). The run writes into `--out` itself, so that a
    killed run resumes from its checkpoints; each part appears whole or not at all (the merges' outputs, each
    `checkpoint-N`, the distilled student), the delta last. The source checks run before `--out` may be cleared, so
    their log (datasets' "Generating train split", the teacher's config) starts aside and joins `OUT/run.log`."""
    out = check_arguments(args, training_args)
    with tempfile.TemporaryDirectory() as scratch:
        early_log = Path(scratch) / console.LOG_FILE
        with console.quiet(early_log, PROG, verbose=args.verbose):
            check_sources(args, training_args, out)
        if training_args.resume_from_checkpoint is None and out.exists():
            remove_tree(out)
        if early_log.exists():
            out.mkdir(parents=True, exist_ok=True)
            with open(out / console.LOG_FILE, "a", encoding="utf-8") as log:
                log.write(early_log.read_text(encoding="utf-8", errors="replace"))
    return out


def main(argv: list[str] | None = None) -> int:
    """Parse here (for `--help` and early errors), prepare `--out`, then run `accelerate launch` on this module."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = make_parser()
    (args, training_args), config_remaining, cli_remaining = parser.parse_with_rest(argv)
    check_launch_arguments(PROG, argv, config_remaining, cli_remaining, parser.option_names())
    prepare_out(args, training_args)
    keep(
        f"the published checkpoints under {Path(args.out) / TRAINING} and a finished init-student",
        resume_from_last_checkpoint,
    )
    say_resumed(PROG, training_args, Path(args.out) / TRAINING)
    with console.quiet(Path(args.out) / console.LOG_FILE, PROG, verbose=args.verbose):
        code = launch(__name__, argv, config_remaining, cli_remaining)
    if code == 0:
        print(f"wrote {args.out}: {INIT}/, {DISTILLED}/, {DELTA}/", file=sys.stderr)
    return code


def launched(argv: list[str]) -> int:
    """What `accelerate launch` runs on each process (its own flags already taken out)."""
    args, training_args = make_parser().parse_args_and_config(argv, fail_with_unknown_args=False)
    distil(args, training_args, *load_phases(args))
    return 0


if __name__ == "__main__":
    from kinfolk.commands import run

    sys.exit(run(PROG, lambda: launched(sys.argv[1:])))
