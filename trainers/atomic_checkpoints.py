"""Trainer checkpoints that appear whole or not at all (`AtomicCheckpointsMixin`).

transformers' `Trainer._save_checkpoint` writes `checkpoint-N/` in place: a process killed while saving leaves a
half-written directory that `resume_from_checkpoint=True` then picks as the latest and fails on (or worse, loads
a model without its optimizer). The mixin lets the Trainer write the same files into a hidden staging directory
named after the main process (`kinfolk.atomic.staging_path`), then publishes `checkpoint-N/` with one rename
(an atomic exchange if it already exists), and only then rotates old checkpoints. The next save, or the next
run's first save, removes the staging of a writer that died (`kinfolk.atomic.clean_dead_staging`).

It overrides one private method of transformers (checked against 5.2x): a transformers upgrade breaks here, only.

>>> from trl import SFTTrainer
>>> class MyTrainer(AtomicCheckpointsMixin, SFTTrainer):
...     pass
>>> MyTrainer._save_checkpoint is AtomicCheckpointsMixin._save_checkpoint
True
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from accelerate.utils import broadcast_object_list
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, rotate_checkpoints

from kinfolk.atomic import clean_dead_staging, publish, staging_path

TRAINER_STATE = "trainer_state.json"


class AtomicCheckpointsMixin:
    """Put before the Trainer class in the bases: `class MyTrainer(AtomicCheckpointsMixin, SFTTrainer)`."""

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        run_dir = Path(self._get_output_dir(trial=trial))
        final = run_dir / f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
        staging = self._shared_staging(run_dir, final)
        # The Trainer writes `<run_dir>/checkpoint-N`; pointed at the staging directory, it writes the same files there.
        self._get_output_dir = lambda trial=None: str(staging)
        try:
            super()._save_checkpoint(model, trial)
        finally:
            del self._get_output_dir
        self.accelerator.wait_for_everyone()  # every process has written its files (RNG states, shards)
        if self.args.should_save:
            written = staging / final.name
            self._point_state_at(written, final)
            publish(written, final)
            if written.exists():  # after an exchange: the checkpoint it replaced
                shutil.rmtree(written)
            staging.rmdir()
            rotate_checkpoints(
                output_dir=str(run_dir),
                save_total_limit=self.args.save_total_limit,
                best_model_checkpoint=self.state.best_model_checkpoint,
                use_mtime=True,
            )
        self.accelerator.wait_for_everyone()

    def _shared_staging(self, run_dir: Path, final: Path) -> Path:
        """The main process's staging directory, known to every process (they all write into it)."""
        name = [None]
        if self.args.should_save:
            run_dir.mkdir(parents=True, exist_ok=True)
            clean_dead_staging(run_dir)  # what a killed save left, before this one adds to the disk
            name = [str(staging_path(final))]
        if self.accelerator.num_processes > 1:
            broadcast_object_list(name, from_process=0)
        return Path(name[0])

    def _point_state_at(self, written: Path, final: Path) -> None:
        """The Trainer recorded the best checkpoint under the staging path when it is this one: record `final`."""
        best = self.state.best_model_checkpoint
        if best is not None and Path(best) == written:
            self.state.best_model_checkpoint = str(final)
            if (written / TRAINER_STATE).exists():
                self.state.save_to_json(str(written / TRAINER_STATE))
