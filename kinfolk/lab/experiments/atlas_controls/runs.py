"""One family's atlas-controls runs: per adapter seed (a run), every method at every grid point on every target.

Per family, the frozen model's measurement rows (`sources.DriftSources`), the target problems and the atlas (fitted
on the family's train-split copy rows, as in version 1: `kinfolk.lab.methods.atlas.runs.prepare`) are built once per
process. Each training run is kept under `settings.work` as soon as it ends and claimed while it runs
(`kinfolk.claims`), so processes started alike share the work; a run's record (every target, method and
grid point, with their checkpoints) goes to `settings.records/<family>/<run>.json` once whole.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from kinfolk import console
from kinfolk.atomic import write_json
from kinfolk.claims import claimed
from kinfolk.lab.experiments.atlas_controls.settings import ControlsSettings
from kinfolk.lab.methods.atlas.runs import run_name
from kinfolk.lab.methods.cache import cached_json
from kinfolk.lab.protocol.family_runs import record_key
from kinfolk.lab.protocol.records import kept_path, kept_record

RECORD_VERSION = 1
SPLITS = ("validation", "test")


class AtlasControlsRuns:
    """The runs of the settings' families, made or read back; `None` for anything another process holds."""

    record_version = RECORD_VERSION

    def __init__(self, settings: ControlsSettings):
        self.settings = settings
        self.work, self.records = Path(settings.work), Path(settings.records)
        self._prepared: dict[int, tuple[Any, Any]] = {}

    def family_config(self, seed: int):
        from kinfolk.lab.methods.atlas.settings import AtlasSettings, family_config

        config = family_config(seed, AtlasSettings())
        return (
            dataclasses.replace(config, **self.settings.family_overrides) if self.settings.family_overrides else config
        )

    def prepared(self, seed: int):
        """(context, drift sources) of a family, built once per process."""
        if seed not in self._prepared:
            from kinfolk.lab.experiments.atlas_controls.sources import DriftSources
            from kinfolk.lab.methods.atlas.runs import prepare
            from kinfolk.lab.methods.atlas.settings import AtlasSettings
            from kinfolk.lab.world.family import build_family

            s = self.settings
            family = build_family(self.family_config(seed), progress=False)
            v1 = AtlasSettings(
                targets=list(s.targets), steps=s.steps, checkpoint_every=s.checkpoint_every, kl_contexts=s.kl_contexts,
                validation_problems=s.validation_problems, eval_problems=s.eval_problems,
            )  # fmt: skip
            context = prepare(family, v1)
            frozen = family.load("large_base").eval()
            sources = DriftSources.build(frozen, context.tokenizer, s.kl_contexts, seed, SPLITS)
            self._prepared[seed] = (context, sources)
        return self._prepared[seed]

    def run(self, seed: int, run: int, target: str, method: str, rate: float, strength: float | None):
        """One training run's checkpoints (kept), or None while another process runs it."""
        from kinfolk.lab.experiments.atlas_controls.sources import measure_checkpoint
        from kinfolk.lab.methods.atlas.runs import train_run

        name = run_name(method, rate, strength)
        where = self.work / str(seed) / f"run{run}" / target / name
        if (where / "result.json").exists():
            return json.loads((where / "result.json").read_text())
        with claimed(where) as ours:
            if not ours:
                return None

            def train() -> dict[str, Any]:
                context, sources = self.prepared(seed)
                console.stage(f"family {seed} run {run}: {target} {name}")
                return train_run(
                    context, target, method, rate, strength, measure_at_start=True, seed=100 * seed + run,
                    measure_point=lambda c, t, model, step: measure_checkpoint(c, sources, t, model, step),
                )  # fmt: skip

            return cached_json(where / "result.json", train)

    def record(self, seed: int, run: int) -> dict[str, Any] | None:
        """The run's record, kept once every target's every method and grid point is; None while any is another
        process's."""
        kept = kept_record(self.records, record_key(seed, run), RECORD_VERSION)
        if kept is not None:
            return kept
        s = self.settings
        targets = {
            target: {
                run_name(method, rate, strength): self.run(seed, run, target, method, rate, strength)
                for method in s.methods
                for rate, strength in s.runs_of(method)
            }
            for target in s.targets
        }
        if any(result is None for runs in targets.values() for result in runs.values()):
            return None
        record = {"record_version": RECORD_VERSION, "family": seed, "run": run, "targets": targets}
        write_json(kept_path(self.records, record_key(seed, run)), record)
        return record
