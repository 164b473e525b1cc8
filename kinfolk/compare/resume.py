"""How a stopped run of `kinfolk compare` resumes within itself, not from its first step.

While a run trains, `CheckpointAtMeasurements` saves a trainer checkpoint at each measured step but the last (the
trainer keeps only the newest, `save_total_limit=1`; published whole by `AtomicCheckpointsMixin`) and writes the
seconds spent so far beside it (`SITTINGS_FILE`). The next sitting's `resume_point` reads what an interrupted run
left in its folder: its last checkpoint, to continue from with transformers' resume (weights, optimiser, scheduler,
RNG states and the place in the data order), or nothing, and then the folder is cleared (an old log and caches would
mix with the new run's). The measurements after the checkpoint are taken again and appended to `drift.jsonl` and the
answers log, where the later row of a step wins, so a resumed run's log equals an uninterrupted one's
(tests/test_compare_resume.py checks it for an adapter, a regulariser and full fine-tuning). Once the run is done,
`finished` removes its checkpoints: the comparison keeps logs, not weights.

>>> import tempfile
>>> folder = Path(tempfile.mkdtemp())
>>> _ = (folder / "drift.jsonl").write_text("{}")  # an interrupted run's log, without a checkpoint
>>> resume_point(folder)
ResumePoint(checkpoint=None, seconds=0.0)
>>> list(folder.iterdir())  # cleared: the run starts again
[]
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, get_last_checkpoint

from kinfolk.atomic import write_json
from kinfolk.callbacks.schedule import MeasuredAtSteps
from kinfolk.claims import CLAIM_FILE

SITTINGS_FILE = "sittings.json"  # {"step": the last checkpoint's step, "seconds": spent on the run until then}
MODEL_CARD = "README.md"  # SFTTrainer's, written into the output directory at each checkpoint


@dataclass(frozen=True)
class ResumePoint:
    """Where a run's next sitting starts."""

    checkpoint: str | None  # the checkpoint folder to resume from; None: from step 0
    seconds: float  # wall time the earlier sittings spent on the run


def resume_point(folder: Path) -> ResumePoint:
    """Where the run in `folder` starts: its last whole checkpoint, or (none kept) step 0 in a cleared folder."""
    last = get_last_checkpoint(str(folder)) if folder.is_dir() else None
    if last is not None:
        sittings = folder / SITTINGS_FILE
        # a process stopped between publishing the checkpoint and this file undercounts one interval's seconds
        seconds = json.loads(sittings.read_text())["seconds"] if sittings.is_file() else 0.0
        return ResumePoint(last, seconds)
    if folder.is_dir():
        for left in folder.iterdir():
            if left.name != CLAIM_FILE:
                shutil.rmtree(left) if left.is_dir() else left.unlink()
    return ResumePoint(None, 0.0)


def finished(folder: Path) -> None:
    """Remove a done run's checkpoints, their seconds and the model card TRL writes beside each checkpoint (it
    describes weights the comparison does not keep): only its logs are the comparison's."""
    for checkpoint in folder.glob(f"{PREFIX_CHECKPOINT_DIR}-*"):
        shutil.rmtree(checkpoint)
    for left in (SITTINGS_FILE, MODEL_CARD):
        (folder / left).unlink(missing_ok=True)


class CheckpointAtMeasurements(MeasuredAtSteps):
    """A checkpoint at every step the run measures (the measuring callbacks' schedule: `every_n_steps` or
    `at_steps`), but the last one (the run is done there), and the seconds spent so far beside it (`earlier`: those
    of the sittings before this one)."""

    def __init__(
        self, every_n_steps: int | None, at_steps: Collection[int] | None, last_step: int, folder: Path, earlier: float
    ):
        super().__init__(every_n_steps=every_n_steps, at_steps=at_steps)
        self.last_step, self.folder, self.earlier = last_step, folder, earlier
        self.start = time.perf_counter()

    def measure_step(self, args, state, control) -> None:
        if state.global_step < self.last_step:
            control.should_save = True

    def on_save(self, args, state, control, **kwargs):
        if args.process_index == 0:
            spent = self.earlier + time.perf_counter() - self.start
            write_json(self.folder / SITTINGS_FILE, {"step": state.global_step, "seconds": round(spent, 3)})
