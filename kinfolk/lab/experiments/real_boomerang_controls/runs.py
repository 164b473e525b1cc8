"""One seed of real-boomerang version 2: its draw of held-out rows (32 per source from pools of 81 to 882 items),
the teacher's reference on them, and three arms, each measured at every size in both patch orders: the student
trained with ADAPT's distillation loss, the same student trained with cross-entropy alone (the same rows, order,
steps and schedule: the distillation terms' weights are 0), and the untrained layer-dropped student.

An arm is kept under `settings.work/seed-<seed>/<arm>/arm.json` once trained and measured (with its seconds), and is
claimed while made, so processes started alike share a seed's arms; the seed's record (`settings.records/<seed>.json`)
is written once its three arms are kept. The shared pieces are `kinfolk.lab.methods.adapt.size_runs`'s.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from kinfolk import console
from kinfolk.atomic import write_json
from kinfolk.claims import claimed
from kinfolk.lab.experiments.real_boomerang_controls.settings import LOSS_WEIGHTS, RealBoomerangControlsSettings
from kinfolk.lab.methods import real_corpus as corpus
from kinfolk.lab.methods.adapt.size_runs import SizeCurveRuns
from kinfolk.lab.methods.cache import cached_json
from kinfolk.lab.protocol.records import kept_path, kept_record
from kinfolk.lab.world.heldout import TeacherReference
from kinfolk.plugins.adapt.layer_map import LAYER_MAP_FILE

RECORD_VERSION = 1
ARM_FILE = "arm.json"


def record_key(seed: int) -> str:
    """A seed's key among the kept records."""
    return str(seed)


class RealBoomerangControlsRuns(SizeCurveRuns):
    settings: RealBoomerangControlsSettings
    record_version = RECORD_VERSION
    record_key = staticmethod(record_key)

    def __init__(self, settings: RealBoomerangControlsSettings):
        super().__init__(settings)
        self._reference: tuple[int, TeacherReference] | None = None

    def doc_source(self) -> dict[str, str]:
        """Documentation topics in chunks: whole topics leave 20 held out, fewer than a seed measures."""
        return corpus.doc_chunks()

    def measured_names(self, seed: int) -> dict[str, list[str]]:
        """The seed's held-out rows, by source."""
        rows = self.settings.measured_rows_per_source
        return {source: corpus.seed_measurement_names(items, rows, seed) for source, items in self.sources.items()}

    def reference(self, seed: int) -> TeacherReference:
        """The teacher's log-probabilities on the seed's rows (one seed's at a time: about 1 GB)."""
        if self._reference is None or self._reference[0] != seed:
            self._reference = None
            rows = self.measurement_rows(self.measured_names(seed), self.settings.measured_length)
            self._reference = (seed, TeacherReference(self.teacher, rows))
        return self._reference[1]

    def student(self, seed: int, arm: str) -> Path:
        if arm == "undistilled":
            return self.init_student()
        return self.train_student(seed, self.work / f"seed-{seed}" / arm, **LOSS_WEIGHTS[arm])

    def make_arm(self, seed: int, arm: str) -> dict[str, Any]:
        start = time.perf_counter()
        student = self.student(seed, arm)
        trained = time.perf_counter()
        curves = self.curve(student, f"{arm}-seed-{seed}", self.reference(seed))
        return {
            "arm": arm,
            "layer_map": json.loads((student / LAYER_MAP_FILE).read_text()) if arm != "undistilled" else None,
            "curves": curves,
            "seconds": {"training": round(trained - start, 1), "measuring": round(time.perf_counter() - trained, 1)},
        }

    def arm(self, seed: int, arm: str) -> dict[str, Any] | None:
        """The arm's curves, made unless kept; None while another live process makes them."""
        where = self.work / f"seed-{seed}" / arm
        if (where / ARM_FILE).exists():
            return json.loads((where / ARM_FILE).read_text())
        with claimed(where) as ours:
            if not ours:
                return None
            console.stage(f"seed {seed}: {arm}")
            return cached_json(where / ARM_FILE, lambda: self.make_arm(seed, arm))

    def record(self, seed: int) -> dict[str, Any] | None:
        """The seed's whole record, read back when it is already kept; None while another process makes an arm."""
        kept = kept_record(self.settings.records, record_key(seed), RECORD_VERSION)
        if kept is not None:
            return kept
        arms = {arm: self.arm(seed, arm) for arm in self.settings.arms}
        # an arm another process held may have been kept while this one made the later arms: read it again, so
        # whichever process keeps the seed's last arm writes the record
        arms = {arm: made or self.arm(seed, arm) for arm, made in arms.items()}
        if any(made is None for made in arms.values()):
            return None
        record = {
            "record_version": RECORD_VERSION,
            "seed": seed,
            "teacher": self.settings.model,
            "layer_map": arms["distilled"]["layer_map"],
            "measured": self.measured_names(seed),
            "seconds": {arm: made["seconds"] for arm, made in arms.items()},
            "validation": {},
            "test": {arm: made["curves"] for arm, made in arms.items()},
        }
        write_json(kept_path(self.settings.records, record_key(seed)), record)
        return record
