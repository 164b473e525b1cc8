"""ADAPT's distillation of a teacher into its layer-dropped student: init-student, two phases, delta.

`distil_student` runs the three steps the ADAPT pipeline runs per teacher under one output directory, on every
process of a launch (the merges and the final rename on the main one):

    OUT/init-student/   the teacher's layers of `layers` (default: every other layer and the last, as the paper),
                        embeddings, norm and head; the layer map beside it
    OUT/training/       the trainer's checkpoints and logs
    OUT/distilled/      the distilled student: pre-training text first (every token's CE, KL and block cosine),
                        then SFT data (response tokens only), `pretraining_fraction` of the steps on the first, one
                        learning-rate schedule (ADAPT §3.2)
    OUT/delta/          distilled − init, for `apply-delta` on each variant

`kinfolk distil` is its command line (`kinfolk.commands.distil`).

>>> layer_selection("{every: 2, last: 1}").to_dict()
{'every': 2, 'last': 1}
"""

from __future__ import annotations

import shutil
from pathlib import Path

import yaml

from kinfolk.atomic import clean_dead_staging, publish, staging_path
from kinfolk.errors import InputError, LayerMapError
from kinfolk.plugins.adapt.layer_map import LayerSelection
from kinfolk.process_group import end_training

INIT, TRAINING, DISTILLED, DELTA = "init-student", "training", "distilled", "delta"


def layer_selection(layers: str | dict) -> LayerSelection:
    """A layer selection given as YAML text (`--layers` on the command line) or as a mapping (a config file)."""
    try:
        values = yaml.safe_load(layers) if isinstance(layers, str) else layers
    except yaml.YAMLError as error:
        raise LayerMapError(f"--layers {layers!r} is not valid YAML ({' '.join(str(error).split())})") from None
    if not isinstance(values, dict):
        raise LayerMapError(f"--layers expects a mapping such as '{{every: 2, last: 1}}', got {layers!r}")
    return LayerSelection.from_dict(values)


def distil_student(
    teacher: str | Path,
    out: str | Path,
    layers: str | dict | LayerSelection,
    training_args,
    pretraining=None,
    sft=None,
) -> Path:
    """init-student → distillation on `pretraining` then `sft` (datasets; either may be None for one phase) →
    delta, under `out`; returns the distilled student's directory. `training_args` is a
    `LayerDistillationConfig`; its `output_dir` is set to `out/training`, and a `resume_from_checkpoint` of
    "true" continues from that directory's last checkpoint."""
    from accelerate import PartialState
    from transformers import AutoTokenizer
    from transformers.trainer_utils import get_last_checkpoint

    from kinfolk.plugins.adapt import DeltaConfig, InitStudentConfig, merge
    from kinfolk.trainers import LayerDistillationTrainer

    if pretraining is None and sft is None:
        raise InputError("distil needs pre-training or SFT data (or both)")
    selection = layers if isinstance(layers, LayerSelection) else layer_selection(layers)
    state = PartialState()
    out = Path(out)
    init, distilled = out / INIT, out / DISTILLED
    if state.is_main_process and not (init / "config.json").exists():
        merge(InitStudentConfig(teacher=str(teacher), layers=selection), init, overwrite=True, progress=False)
    state.wait_for_everyone()

    if sft is None:  # one phase of pre-training text: trained as the first phase is, on every token
        sft, pretraining = pretraining, None
        training_args.completion_only_loss = False
    training_args.output_dir = str(out / TRAINING)
    trainer = LayerDistillationTrainer(
        model=str(init),
        teacher_model=str(teacher),
        args=training_args,
        train_dataset=sft,
        pretraining_dataset=pretraining,
        processing_class=AutoTokenizer.from_pretrained(init),
    )
    resume = training_args.resume_from_checkpoint
    if resume is not None and not (isinstance(resume, str) and Path(resume).is_dir()):  # "true": this out's last
        resume = get_last_checkpoint(training_args.output_dir)
    trainer.train(resume_from_checkpoint=resume)
    staging = _shared_staging(distilled, state)
    trainer.save_model(str(staging))  # every process takes part (sharded weights are gathered); the main one writes
    state.wait_for_everyone()
    if state.is_main_process:  # the distilled student, then its delta (written last: the run is complete)
        publish(staging, distilled)
        if staging.exists():  # after an exchange: the distilled student of an earlier run
            shutil.rmtree(staging)
        merge(DeltaConfig(init=str(init), distilled=str(distilled)), out / DELTA, overwrite=True, progress=False)
    end_training(trainer)  # the DDP wrapper goes while the group is alive (kinfolk.process_group)
    return distilled


def _shared_staging(destination: Path, state) -> Path:
    """The main process's staging sibling of `destination` (`kinfolk.atomic.staging_path`), known to every process."""
    from accelerate.utils import broadcast_object_list

    name = [None]
    if state.is_main_process:
        clean_dead_staging(destination.parent, destination.name)  # what a run killed while saving left
        name = [str(staging_path(destination))]
    if state.num_processes > 1:
        broadcast_object_list(name, from_process=0)
    return Path(name[0])
