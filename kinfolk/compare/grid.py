"""The runs of a comparison, where each one lives, and training them with resume per run.

A run is one (method, learning rate, seed), trained for a fixed number of steps into its own folder
`OUT/runs/<method>/lr-<rate>/seed-<seed>/`, whose `drift.jsonl` gets the target metric and the retained KL at every
evaluation step (step 0, the untouched model, included). `run.json` (`RunRecord`) is written atomically once the
run has finished: a rerun of the same comparison skips every run that has one and trains the others (a folder
without `run.json` is what an interrupted run left: `train` resumes it from the checkpoint it kept, or clears it and
starts again). A `run.json` written
under other settings (`RunRecord.settings`, a fingerprint of everything that shapes the run; `setting_values`, the
settings themselves) is refused before any training, naming each setting that differs: the comparison would
otherwise mix runs of two different set-ups.

Several processes started on the same `OUT` (one per GPU, or a SLURM array's jobs) share the grid: each claims a
run's folder before training it (`kinfolk.claims`, as the lab's family runs do: an atomic claim file, a dead
process's claim taken over) and passes over a run another live process holds, so each run is trained once.
`run_grid` returns None while another process still holds a run: that process, finishing last, writes the report.

Training and reading a run's log are the caller's (`train`, `load`): this module holds the bookkeeping only, so
it depends on no trainer.

>>> import tempfile
>>> key = RunKey("lora", 1e-4, 0)
>>> key.name, key.folder("out").as_posix()
('lora lr=0.0001 seed=0', 'out/runs/lora/lr-0.0001/seed-0')
>>> [k.name for k in run_keys(["lora", "atlas"], [1e-4], [0, 1])]
['lora lr=0.0001 seed=0', 'lora lr=0.0001 seed=1', 'atlas lr=0.0001 seed=0', 'atlas lr=0.0001 seed=1']
>>> read_record(tempfile.mkdtemp()) is None  # not finished
True
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from kinfolk.atomic import fingerprint, write_json
from kinfolk.claims import claimed
from kinfolk.compare.measures import Curves
from kinfolk.compare.resume import ResumePoint
from kinfolk.console import bar, stage
from kinfolk.errors import InputError, OutputExistsError
from kinfolk.inputs import read_json

RUN_FILE = "run.json"
RUNS_FOLDER = "runs"


@dataclass(frozen=True, order=True)
class RunKey:
    """One run of the grid."""

    method: str
    learning_rate: float
    seed: int

    @property
    def rate(self) -> str:
        """The learning rate as written in folder names and reports (`%g`: 0.0001, 3e-05)."""
        return f"{self.learning_rate:g}"

    @property
    def name(self) -> str:
        return f"{self.method} lr={self.rate} seed={self.seed}"

    def folder(self, out: str | Path) -> Path:
        return Path(out) / RUNS_FOLDER / self.method / f"lr-{self.rate}" / f"seed-{self.seed}"


@dataclass(frozen=True)
class RunRecord:
    """`run.json`: a finished run, the settings it was trained under and what its log ended with."""

    method: str
    learning_rate: float
    seed: int
    settings: str  # fingerprint of the run's settings (`check_settings`)
    steps: int
    seconds: float  # wall time of training and measuring, over every sitting of a resumed run
    start_target: float
    final_target: float
    final_kl: float
    setting_values: dict[str, Any] | None = None  # the settings fingerprinted (None in records written before them)


def settings_changed(recorded: Mapping[str, Any], now: Mapping[str, Any]) -> list[str]:
    """Each setting whose value differs, as "name recorded (now value)".

    >>> settings_changed({"max_steps": 12, "rank": 4}, {"max_steps": 6, "rank": 4})
    ['max_steps 12 (now 6)']
    """
    names = [*recorded, *(name for name in now if name not in recorded)]
    return [
        f"{name} {recorded.get(name, 'unset')} (now {now.get(name, 'unset')})"
        for name in names
        if recorded.get(name) != now.get(name)
    ]


def run_keys(
    methods: Sequence[str], learning_rates: Sequence[float] | Mapping[str, Sequence[float]], seeds: Sequence[int]
) -> list[RunKey]:
    """Every (method, rate, seed), methods in the order given, then rates, then seeds; `learning_rates` one grid
    for all, or each method's own."""
    grid = learning_rates if isinstance(learning_rates, Mapping) else dict.fromkeys(methods, learning_rates)
    return [RunKey(method, float(rate), int(seed)) for method in methods for rate in grid[method] for seed in seeds]


def read_record(folder: str | Path) -> RunRecord | None:
    """The finished run's record, or None when the folder holds no `run.json` (never started, or interrupted)."""
    path = Path(folder) / RUN_FILE
    if not path.is_file():
        return None
    fields = read_json(path, "run record")
    try:
        return RunRecord(**fields)
    except TypeError as error:
        raise InputError(f"{path} is not a kinfolk compare run record ({error})") from None


def check_settings(keys: Sequence[RunKey], out: str | Path, settings: Mapping[str, Mapping[str, Any]]) -> None:
    """Refuse a finished run of `keys` whose `run.json` was written under other settings than `settings[method]`,
    naming the settings that differ: before any model loads, so the user can choose another `--out` or remove that
    run."""
    for key in keys:
        record = read_record(key.folder(out))
        if record is None or record.settings == fingerprint(settings[key.method]):
            continue
        if record.setting_values is not None:
            differ = "; ".join(settings_changed(record.setting_values, settings[key.method]))
        else:  # a record from before the values were kept: only its fingerprint is known
            differ = f"settings fingerprint {record.settings}, now {fingerprint(settings[key.method])}"
        raise OutputExistsError(
            f"{key.folder(out)} holds a run trained with other settings ({differ}); use another --out or remove "
            "that folder to train it again",
            path=key.folder(out),
        )


# train(key, folder, step_done) trains one run into `folder` (resuming what an interrupted one left there, or clearing
# it), calling `step_done()` after each optimiser step it takes; it returns where it started (`ResumePoint`)
Train = Callable[[RunKey, Path, Callable[[], None]], ResumePoint]
Load = Callable[[RunKey, Path], Curves]  # a run's curves from its log


def run_grid(
    keys: Sequence[RunKey],
    out: str | Path,
    settings: Mapping[str, Mapping[str, Any]],
    steps: int,
    train: Train,
    load: Load,
) -> dict[RunKey, Curves] | None:
    """Train every run of `keys` that has not finished and no other live process holds, skipping those that have
    finished; one terminal line per run and one progress bar over every step of the grid. Returns each run's
    curves, or None when another process was still training one of them at the end."""
    runs: dict[RunKey, Curves] = {}
    others = []
    progress = bar(total=steps * len(keys), unit="step", desc="compare")
    try:
        for key in keys:
            folder = key.folder(out)
            record = read_record(folder)
            if record is None:
                with claimed(folder) as ours:
                    if ours:
                        progress.set_description(key.name)
                        record, runs[key], start = _train_one(
                            key, folder, settings[key.method], steps, train, load, progress.update
                        )
                        line = f"{key.name}: {record.seconds:.0f}s, {_summary(record)}"
                        if start.checkpoint is not None:
                            line += f" (resumed from {Path(start.checkpoint).name})"
                if not ours:
                    record = read_record(folder)  # finished by the other process meanwhile, or still its
                    if record is None:
                        others.append(key)
                        line = f"{key.name}: another process's"
                    else:
                        runs[key] = load(key, folder)
                        line = f"{key.name}: done by another process, {_summary(record)}"
                    progress.update(steps)
            else:
                runs[key] = load(key, folder)
                progress.update(steps)
                line = f"{key.name}: done earlier, {_summary(record)}"
            progress.clear()  # the line goes above the bar, not after it
            stage(line)
            progress.refresh()
    finally:
        progress.close()
    still = [key for key in others if read_record(key.folder(out)) is None]
    if still:
        stage(f"{len(still)} run(s) still another process's: the last process to finish writes the report")
        return None
    return runs | {key: load(key, key.folder(out)) for key in others}


def _train_one(
    key: RunKey, folder: Path, settings: Mapping[str, Any], steps: int, train: Train, load: Load, advance
) -> tuple[RunRecord, Curves, ResumePoint]:
    start = time.perf_counter()
    trained = 0

    def step_done() -> None:
        nonlocal trained
        trained += 1
        advance(1)

    start_point = train(key, folder, step_done)
    advance(steps - trained)  # a resumed run's earlier steps, or one that stopped early (none should)
    curves = load(key, folder)
    checkpoints = sorted(curves.validation.checkpoints)
    record = RunRecord(
        key.method,
        key.learning_rate,
        key.seed,
        fingerprint(settings),
        checkpoints[-1][0],
        round(start_point.seconds + time.perf_counter() - start, 3),
        checkpoints[0][1],
        checkpoints[-1][1],
        checkpoints[-1][2],
        dict(settings),
    )
    write_json(folder / RUN_FILE, asdict(record))
    return record, curves, start_point


def _summary(record: RunRecord) -> str:
    """Short enough for one terminal line after the stage prefix."""
    return f"target {record.start_target:.4g}->{record.final_target:.4g}, KL {record.final_kl:.2g}"
