"""One family's runs of the atlantis-controls experiment: its two large bases, its scored pools and every arm.

Per run (a pool draw and a training seed), each cell's pool is drawn and scored by the family's models (the weak
cell rescores the strong `pr` pool's very rows with the weak large base), then every arm at every value of its grid
trains its cell's large base and is scored on the family's validation and test problems. Everything slow is kept
under `settings.work` (each scored pool, each arm's result) and shared between processes started alike
(`kinfolk.claims`); the run's record goes to `settings.records/<family>/<run>.json` once whole.

A record: `bases` (each large base's pre-training steps and skill scores) and, per cell, the pool's size and kinds,
the filter's precision (share of ideal rows it keeps) at each fraction, and per arm and grid value the trained
model's `validation` and `test` accuracies (copy, reverse, mean), the rows it trained on and the weights' ESS.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from datasets import Dataset

from kinfolk import console
from kinfolk.atomic import atomic_directory, write_json
from kinfolk.claims import claimed
from kinfolk.lab.experiments.atlantis_controls.arms import training_rows, verifier_precision
from kinfolk.lab.experiments.atlantis_controls.settings import BASES, Cell, ControlsSettings
from kinfolk.lab.methods.cache import cached_json
from kinfolk.lab.protocol.family_runs import record_key
from kinfolk.lab.protocol.records import kept_path, kept_record
from kinfolk.lab.world.skills import RESPONSE_KINDS

RECORD_VERSION = 1
SCORED_COLUMNS = ["prompt", "completion", "skill", "kind"]


def grid_key(value: float) -> str:
    """A grid value as a record key.

    >>> grid_key(0.001), grid_key(2.0)
    ('0.001', '2')
    """
    return f"{value:g}"


class AtlantisControlsRuns:
    """The runs of the settings' families, made or read back; `None` for anything another process holds."""

    record_version = RECORD_VERSION

    def __init__(self, settings: ControlsSettings):
        self.settings = settings
        self.work, self.records = Path(settings.work), Path(settings.records)
        self._families: dict[tuple[int, str], Any] = {}

    def family(self, seed: int, base: str):
        """The family whose large base is `base`: from the lab cache, or built under a claim (None while another
        process builds it)."""
        from kinfolk.lab.world.family import FAMILY_FILE, build_family, default_cache_dir

        config = self.settings.family_config(seed, base)
        if (seed, base) not in self._families:
            built = (default_cache_dir() / config.cache_key() / FAMILY_FILE).exists()
            with claimed(self.work / "builds" / config.cache_key()) as ours:
                if not (ours or built):
                    return None
                if not built:
                    console.stage(f"family {seed}: building its {base} large base")
                self._families[seed, base] = build_family(config, progress=False)
        return self._families[seed, base]

    def scored(self, seed: int, run: int, cell: Cell) -> Dataset | None:
        """The cell's pool with every model's log-probs and the estimand, kept under the run's work folder."""
        from kinfolk.lab.methods.atlantis import make_pool, score_pool

        where = self.work / str(seed) / f"run{run}" / cell.name.replace("/", "-")
        if (where / "scored" / "dataset_info.json").exists():
            return Dataset.load_from_disk(str(where / "scored"))
        family = self.family(seed, cell.base)
        if cell.base == "weak":  # the very rows of the strong base's pool, rescored
            strong_pool = self.scored(seed, run, Cell("strong", cell.pool, ()))
            pool = None if strong_pool is None else strong_pool.select_columns(SCORED_COLUMNS)
        else:
            pool = None if family is None else make_pool(family, cell.pool, self.settings.pool_size, draw=run)
        if family is None or pool is None:
            return None
        with claimed(where) as ours:
            if not ours:
                return None
            if not (where / "scored" / "dataset_info.json").exists():  # another process may have scored it since
                console.stage(f"family {seed} run {run}: scoring {cell.name}")
                with atomic_directory(where / "scored") as staging:  # a reader never sees half a dataset
                    score_pool(family, pool, cell.pool).save_to_disk(str(staging))
        return Dataset.load_from_disk(str(where / "scored"))

    def arm(self, seed: int, run: int, cell: Cell, arm: str, value: float) -> dict[str, Any] | None:
        """One arm at one grid value: its trained model's accuracies (kept), or None while another process runs it."""
        from kinfolk.lab.methods.atlantis import AtlantisSettings, train_and_score

        where = self.work / str(seed) / f"run{run}" / cell.name.replace("/", "-") / f"{arm}-{grid_key(value)}"
        if (where / "result.json").exists():
            return json.loads((where / "result.json").read_text())
        scored, family = self.scored(seed, run, cell), self.family(seed, cell.base)
        if scored is None or family is None:
            return None
        s = self.settings
        budget = AtlantisSettings(
            steps=s.steps,
            learning_rate=value if arm == "uniform" else s.learning_rate,
            eval_problems=s.eval_problems,
            validation_problems=s.validation_problems,
        )
        rows, weights = training_rows(scored, arm, value)
        data = scored.select(rows).select_columns(["prompt", "completion"])
        with claimed(where) as ours:
            if not ours:
                return None
            console.stage(f"family {seed} run {run}: {cell.name} {arm} {grid_key(value)}")
            seed_of_run = 100 * seed + run
            result = cached_json(
                where / "result.json",
                lambda: {**train_and_score(family, data, weights, seed_of_run, budget), "rows": len(rows)},
            )
        return result

    def record(self, seed: int, run: int) -> dict[str, Any] | None:
        """The run's record, kept once every arm of every cell is; None while any is another process's."""
        kept = kept_record(self.records, record_key(seed, run), RECORD_VERSION)
        if kept is not None:
            return kept
        s = self.settings
        cells: dict[str, Any] = {}
        whole = True
        for cell in s.cells():  # every cell is tried, so a process skips only what another one holds
            arms = {arm: {grid_key(v): self.arm(seed, run, cell, arm, v) for v in s.grid(arm)} for arm in cell.arms}
            scored = self.scored(seed, run, cell)
            if scored is None or any(r is None for grid in arms.values() for r in grid.values()):
                whole = False
            if not whole:
                continue
            kinds = np.asarray(scored["kind"])
            cells[cell.name] = {
                "rows": len(scored),
                "kinds": {kind: int(np.sum(kinds == kind)) for kind in RESPONSE_KINDS},
                "filter_precision": {grid_key(f): verifier_precision(scored, f) for f in s.filter_fractions},
                "arms": arms,
            }
        if not whole:
            return None
        bases = {}
        for base in BASES:
            family = self.family(seed, base)
            if family is None:
                return None
            bases[base] = {"steps": family.steps["large_base"], "scores": family.scores["large_base"]}
        record = {"record_version": RECORD_VERSION, "family": seed, "run": run, "bases": bases, "cells": cells}
        write_json(kept_path(self.records, record_key(seed, run)), record)
        return record
