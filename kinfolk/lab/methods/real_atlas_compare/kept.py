"""Each finished run of a seed kept in the records the moment it ends, and put back into a work folder that lacks it.

A seed of real-atlas-compare is 6-9 runs of 40-60 minutes each on a CPU core, spread over several sittings, but its
work folder (`runs/...`) is not part of the repository: a machine that starts afresh would train every run again
(one session's three finished runs were lost that way). The records folder is committed, so each run's kept files
(`KEPT_FILES`) go there as soon as the run ends, to `<records>/<seed>/<run name>/`, where the seed's whole record
puts them too; each arm's `plan.json` (written before the arm's first run) goes to `<records>/<seed>/plans/`, and
the frozen model's chat answers (the chat pool, made once) to `<records>/chat-answers.json`. Before an arm trains,
whatever the work folder lacks is copied back: compare's grid then finds those runs finished ("done earlier") and the
arm's plan as it was written.

>>> import tempfile
>>> root = Path(tempfile.mkdtemp())
>>> run = root / "work" / "lora" / "lr-0.003" / "seed-0"; run.mkdir(parents=True)
>>> for name in KEPT_FILES: _ = (run / name).write_text(name)
>>> kept = KeptRuns(root / "records", seed=0)
>>> kept.keep_run(run, "lora/lr-0.003")
>>> again = root / "new-machine" / "lora" / "lr-0.003" / "seed-0"
>>> kept.restore_run("lora/lr-0.003", again), (again / "run.json").read_text()
(True, 'run.json')
"""

from __future__ import annotations

import shutil
from pathlib import Path

from kinfolk.atomic import atomic_file
from kinfolk.compare.grid import RUN_FILE
from kinfolk.compare.plan import PLAN_FILE
from kinfolk.compare.resume import finished

# run.json last: it is what marks a run finished (`kinfolk.compare.grid.read_record`), so it arrives after the logs
KEPT_FILES = ("drift.jsonl", "answers.jsonl", RUN_FILE)
CHAT_ANSWERS = "chat-answers.json"


def copy_whole(source: Path, target: Path) -> None:
    """Copy `source` to `target` through `kinfolk.atomic.atomic_file`, so `target` is either absent or whole."""
    with open(source, "rb") as read, atomic_file(target, "wb") as write:
        shutil.copyfileobj(read, write)


def copy_missing(source: Path, target: Path) -> None:
    """Copy `source` to `target` when `target` is missing and `source` is there."""
    if not target.is_file() and source.is_file():
        copy_whole(source, target)


class KeptRuns:
    """One seed's finished runs and arm plans as kept in `records`, and the pool both seeds' runs share."""

    def __init__(self, records: str | Path, seed: int):
        self.seed_folder = Path(records) / str(seed)

    def keep_run(self, folder: Path, name: str) -> None:
        """Keep the finished run in `folder` (a no-op while it has no run.json) under the run name `name`."""
        if not (folder / RUN_FILE).is_file() or (self.seed_folder / name / RUN_FILE).is_file():
            return
        for kept_file in KEPT_FILES:
            if (folder / kept_file).is_file():
                copy_whole(folder / kept_file, self.seed_folder / name / kept_file)

    def restore_run(self, name: str, folder: Path) -> bool:
        """Put the kept run `name` into `folder` unless a finished run is there already (an interrupted one's
        checkpoints are removed: the run is done); whether `folder` holds a finished run after."""
        kept = self.seed_folder / name
        if (folder / RUN_FILE).is_file() or not (kept / RUN_FILE).is_file():
            return (folder / RUN_FILE).is_file()
        for kept_file in KEPT_FILES:
            if (kept / kept_file).is_file():
                copy_whole(kept / kept_file, folder / kept_file)
        finished(folder)
        return True

    def keep_plan(self, out: Path, arm: str) -> None:
        copy_missing(out / PLAN_FILE, self.seed_folder / "plans" / f"{arm}.json")

    def restore_plan(self, arm: str, out: Path) -> None:
        copy_missing(self.seed_folder / "plans" / f"{arm}.json", out / PLAN_FILE)


def share_pool_file(records: str | Path, work: Path, name: str) -> None:
    """The pool file `name` (made once for every seed) copied between the work folder and the records, to whichever
    lacks it."""
    copy_missing(work / name, Path(records) / name)
    copy_missing(Path(records) / name, work / name)
