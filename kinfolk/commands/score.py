"""`kinfolk score`: score an SFT dataset with the three ATLANTIS models and write it back with a weight column.

    kinfolk score --data train.jsonl --large-base Qwen2-7B --small-base Qwen2-1.5B \\
        --reference Qwen2-1.5B-Instruct --out scored.jsonl [--formula ratio --normalization byte ...]
    accelerate launch --num_processes 8 -m kinfolk score ...     # same result, rows split across processes
    accelerate launch --multi_gpu --num_processes 2 -m kinfolk score ...   # CPU-only host (gloo); or torchrun
    kinfolk score --data scored.jsonl --out reweighted/ --formula influence   # new weights, no forward pass
    kinfolk score --data train.jsonl --large-base Qwen2-7B --formula large_base_only --out scored.jsonl  # one model

`--data` is anything `kinfolk.data.load_data` reads (a .jsonl/.json/.parquet/.csv file, a `save_to_disk` folder or a
Hub dataset). `--out` is `*.jsonl` or `*.parquet` (what TRL's `datasets:` mixtures and `kinfolk sft` read), or else
a `save_to_disk` folder, holding the original columns, the scores and the weights. Beside it (inside a folder)
go `weights_report.json` and, with matplotlib, `weights_hist.png` (`<name>.weights_report.json` beside a file);
the report, also printed, ends with the highest- and lowest-weighted rows (docs/atlantis.md: choosing a formula).
Nothing appears unless the run succeeds. Options can also come from a YAML file (`--config score.yaml`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from kinfolk.commands.parsing import VerbParser
from kinfolk.hints import suggest
from kinfolk.plugins.atlantis.config import ROLES, ScoreConfig, logprob_column

MODELS_HINT = "/".join(suggest(option, "score") for option in ("--large_base", "--small_base", "--reference"))

if TYPE_CHECKING:  # the work's modules (datasets, torch, transformers) load when the verb runs, not for --help
    from datasets import Dataset


@dataclass
class ScoreArguments:
    data: str = field(
        metadata={"help": "dataset: a .jsonl/.json/.parquet/.csv file, a `save_to_disk` folder or a Hub dataset."}
    )
    out: str = field(metadata={"help": "output: a .jsonl or .parquet file, or else a `save_to_disk` folder."})
    large_base: str | None = field(default=None, metadata={"help": "large base model (the one SFT will train)."})
    small_base: str | None = field(default=None, metadata={"help": "small base model of the same (or any) family."})
    reference: str | None = field(default=None, metadata={"help": "the small base's instruct/chat model."})
    split: str = field(default="train", metadata={"help": "split to score when --data holds several."})
    overwrite: bool = field(default=False, metadata={"help": "replace an existing --out."})
    verbose: bool = field(
        default=False, metadata={"help": "show the libraries' output (else: NAME.run.log beside --out)."}
    )


def write_scored(scored: Dataset, report: dict, weights, out: str | Path, overwrite: bool) -> None:
    """The scored rows at `out` (a folder with the report inside, or a file with the report beside it)."""
    from kinfolk.atomic import atomic_directory
    from kinfolk.data import save_dataset, writes_folder
    from kinfolk.plugins.atlantis.diagnostics import write_report

    out = Path(out)
    if writes_folder(out):
        with atomic_directory(out, overwrite=overwrite) as staging:
            scored.save_to_disk(str(staging))
            write_report(report, staging, weights=weights)
        return
    write_report(report, out.parent, weights=weights, prefix=f"{out.stem}.")
    save_dataset(scored, out, overwrite=overwrite)  # last: the data file appears only when all else is written


def check_space(args: ScoreArguments, config: ScoreConfig, scoring: bool) -> None:
    """Refuse before any work when `--out` (about twice the input's bytes: its columns plus the scores, and the
    report) or the score cache (at most the input's bytes: three numbers per row and model) cannot fit."""
    from kinfolk.diskspace import check_free_space, path_bytes
    from kinfolk.interrupt import keep
    from kinfolk.plugins.atlantis.cache import default_cache_dir

    data_bytes = path_bytes(args.data)
    check_free_space(args.out, 2 * data_bytes, "the scored rows (about twice the input's size)")
    if scoring and config.use_cache:
        cache = config.cache_dir or default_cache_dir()
        check_free_space(cache, data_bytes, "the score cache")
        keep(f"the score cache in {cache}, every chunk scored so far (a rerun scores only the rest)")


def run(args: ScoreArguments, config: ScoreConfig) -> Dataset:
    from kinfolk.console import log_beside, quiet
    from kinfolk.data import check_output
    from kinfolk.plugins.atlantis.preflight import check_scoring_inputs
    from kinfolk.plugins.atlantis.scoring import process_state

    state = process_state()
    check_output(args.out, args.overwrite)
    models = {"large_base": args.large_base, "small_base": args.small_base, "reference": args.reference}
    if any(models.values()):  # models, the formula's needs, the cache and --out: before the data is even read
        check_scoring_inputs(models, config, out=args.out, overwrite=args.overwrite)
    check_space(args, config, scoring=any(models.values()))
    with quiet(log_beside(args.out), "kinfolk score", verbose=args.verbose):
        return _score_and_write(args, config, models, state)


def _score_and_write(args: ScoreArguments, config: ScoreConfig, models: dict, state) -> Dataset:
    from kinfolk.console import log_beside, show
    from kinfolk.data import load_data, naming
    from kinfolk.plugins.atlantis.diagnostics import format_report, weight_report
    from kinfolk.plugins.atlantis.pipeline import reweight_dataset, score_dataset
    from kinfolk.plugins.atlantis.weights import weights_from_scores
    from kinfolk.tokens import DatasetFormatError

    with state.main_process_first():
        dataset = load_data(args.data, args.split)
    with naming(args.data):
        if any(models.values()):
            scored = score_dataset(dataset, **models, config=config, state=state)
        elif any(logprob_column(role) in dataset.column_names for role in ROLES):
            scored = reweight_dataset(dataset, config)
        else:
            raise DatasetFormatError(
                f"no model given and {args.data} holds no scores ({', '.join(logprob_column(r) for r in ROLES)}); "
                f"pass {MODELS_HINT}"
            )
    if state.is_main_process:
        report = weight_report(scored, config.weight_config(), text_field=config.dataset_text_field)
        show(format_report(report))
        result = weights_from_scores(scored, config.weight_config())
        write_scored(scored, report, result.weights[result.scored], args.out, args.overwrite)
        show(f"wrote {len(scored)} rows to {args.out}; the libraries' output: {log_beside(args.out)}")
    state.wait_for_everyone()
    return scored


def main(argv: list[str] | None = None) -> int:
    parser = VerbParser((ScoreArguments, ScoreConfig), prog="kinfolk score", description=__doc__.split("\n\n")[0])
    run(*parser.parse(argv))
    return 0
