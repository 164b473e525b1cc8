"""Distil a layer-subset student from its teacher with the ADAPT two-phase recipe, configured like `trl sft`.

    kinfolk merge init-student student.yaml --out students/base-init
    accelerate launch examples/distill.py --config distill.yaml

`distill.yaml` holds this script's arguments and any `DistillationConfig` / `SFTConfig` field:

    student: students/base-init
    teacher: models/Qwen3-4B-Base
    pretraining_data: data/pile-sample.jsonl   # {"text": ...} rows (phase 1); omit for one phase
    sft_data: data/math-sft.jsonl              # prompt / completion or messages rows (phase 2)
    output_dir: students/base-distilled
    max_length: 2048
    per_device_train_batch_size: 8

Data arguments take what `kinfolk.data.load_data` reads: a local .jsonl / .json / .parquet / .csv file, a
`save_to_disk` folder (e.g. `kinfolk score --out`) or a Hub dataset name.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from transformers import AutoTokenizer
from trl import TrlParser

from kinfolk.data import load_data
from kinfolk.trainers import DistillationConfig, DistillationTrainer


@dataclass
class DistillScriptArguments:
    student: str = field(metadata={"help": "student directory (from `kinfolk merge init-student`)"})
    teacher: str = field(metadata={"help": "teacher model directory or Hub id"})
    sft_data: str = field(
        metadata={"help": "SFT data (phase 2): a data file, a `save_to_disk` folder or a Hub dataset"}
    )
    pretraining_data: str | None = field(default=None, metadata={"help": "pre-training text (phase 1), optional"})
    split: str = field(default="train", metadata={"help": "split of Hub datasets"})


def main() -> None:
    script_args, training_args = TrlParser((DistillScriptArguments, DistillationConfig)).parse_args_and_config()
    trainer = DistillationTrainer(
        model=script_args.student,
        teacher_model=script_args.teacher,
        args=training_args,
        train_dataset=load_data(script_args.sft_data, script_args.split),
        pretraining_dataset=load_data(script_args.pretraining_data, script_args.split)
        if script_args.pretraining_data
        else None,
        processing_class=AutoTokenizer.from_pretrained(script_args.student),
    )
    trainer.train()
    trainer.save_model()


if __name__ == "__main__":
    main()
