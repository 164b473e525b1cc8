"""`kinfolk score`: score an SFT dataset with the three ATLANTIS models and write it back with a weight column.

    kinfolk score --data train.jsonl --large-base Qwen2-7B --small-base Qwen2-1.5B \\
        --reference Qwen2-1.5B-Instruct --out scored/ [--formula ratio --normalization byte ...]
    accelerate launch --num_processes 8 -m kinfolk score ...     # same result, rows split across processes
    accelerate launch --multi_gpu --num_processes 2 -m kinfolk score ...   # CPU-only host (gloo); or torchrun
    kinfolk score --data scored/ --out reweighted/ --formula influence   # new weights, no forward pass

`--out` is a `datasets` directory (`load_from_disk`) holding the original columns, the scores and the weights,
plus `weights_report.json` and, with matplotlib, `weights_hist.png`; it appears only when the run succeeds.
Options can also come from a YAML file (`--config score.yaml`), as with TRL's scripts.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from datasets import Dataset, DatasetDict, load_dataset, load_from_disk
from trl import TrlParser

from kinfolk.atomic import OutputExistsError, atomic_directory, check_destination
from kinfolk.tokens import DatasetFormatError
from kinfolk.trainers.atlantis.config import ROLES, ScoreConfig, logprob_column
from kinfolk.trainers.atlantis.diagnostics import format_report, weight_report, write_report
from kinfolk.trainers.atlantis.pipeline import score_dataset
from kinfolk.trainers.atlantis.scoring import ScoringError, process_state
from kinfolk.trainers.atlantis.weights import compute_weights, weights_from_scores

FILE_BUILDERS = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv", ".arrow": "arrow"}


@dataclass
class ScoreArguments:
    data: str = field(
        metadata={"help": "dataset: a `save_to_disk` directory, or a .json/.jsonl/.parquet/.csv/.arrow file."}
    )
    out: str = field(metadata={"help": "output dataset directory (written atomically)."})
    large_base: str | None = field(default=None, metadata={"help": "large base model (the one SFT will train)."})
    small_base: str | None = field(default=None, metadata={"help": "small base model of the same (or any) family."})
    reference: str | None = field(default=None, metadata={"help": "the small base's instruct/chat model."})
    split: str = field(default="train", metadata={"help": "split to score when --data holds several."})
    overwrite: bool = field(default=False, metadata={"help": "replace an existing --out."})


def load_data(path: str, split: str = "train") -> Dataset:
    """A dataset from a `save_to_disk` directory or a data file, as `kinfolk` verbs accept it."""
    location = Path(path)
    if location.is_dir():
        loaded = load_from_disk(str(location))
        if isinstance(loaded, DatasetDict):
            if split not in loaded:
                raise DatasetFormatError(f"{path} has splits {list(loaded)}, not {split!r}; pass --split")
            loaded = loaded[split]
        return loaded
    builder = FILE_BUILDERS.get(location.suffix)
    if builder is None or not location.is_file():
        raise DatasetFormatError(
            f"--data {path} is neither a dataset directory nor a file ending in {', '.join(FILE_BUILDERS)}"
        )
    return load_dataset(builder, data_files=str(location), split="train")


def run(args: ScoreArguments, config: ScoreConfig) -> Dataset:
    state = process_state()
    check_destination(args.out, args.overwrite)
    with state.main_process_first():
        dataset = load_data(args.data, args.split)
    models = {"large_base": args.large_base, "small_base": args.small_base, "reference": args.reference}
    if any(models.values()):
        scored = score_dataset(dataset, **models, config=config, state=state)
    elif any(logprob_column(role) in dataset.column_names for role in ROLES):
        scored = compute_weights(dataset, config.weight_config())
    else:
        raise DatasetFormatError(
            f"no model given and {args.data} holds no scores ({', '.join(logprob_column(r) for r in ROLES)}); "
            "pass --large_base/--small_base/--reference"
        )
    if state.is_main_process:
        report = weight_report(scored, config.weight_config())
        print(format_report(report))
        result = weights_from_scores(scored, config.weight_config())
        with atomic_directory(args.out, overwrite=args.overwrite) as staging:
            scored.save_to_disk(str(staging))
            write_report(report, staging, weights=result.weights[result.scored])
        print(f"wrote {len(scored)} rows to {args.out}")
    state.wait_for_everyone()
    return scored


def main(argv: list[str] | None = None) -> int:
    parser = TrlParser((ScoreArguments, ScoreConfig), prog="kinfolk score", description=__doc__.split("\n\n")[0])
    args, config = parser.parse_args_and_config(argv)
    try:
        run(args, config)
    except (DatasetFormatError, ScoringError, OutputExistsError) as error:
        print(f"kinfolk score: error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
