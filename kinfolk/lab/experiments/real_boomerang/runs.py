"""One seed of the real-boomerang experiment: the undistilled student's curve (once: it does not depend on the
seed), the seed's two-phase distillation and its curve, in both patch orders, measured on the same held-out rows
for every seed. The shared pieces are `kinfolk.lab.methods.adapt.size_runs`'s.

Each seed's record (`settings.records/<seed>.json`: per size and source, the depth, parameters, log perplexity, KL to
the teacher and agreement) is written atomically once the seed is whole.
"""

from __future__ import annotations

import json
from typing import Any

from kinfolk.atomic import write_json
from kinfolk.lab.methods import real_corpus as corpus
from kinfolk.lab.methods.adapt.size_runs import SizeCurveRuns
from kinfolk.lab.protocol.records import kept_path, kept_record
from kinfolk.lab.world.heldout import TeacherReference
from kinfolk.plugins.adapt.layer_map import LAYER_MAP_FILE

RECORD_VERSION = 1


def record_key(seed: int) -> str:
    """A seed's key among the kept records."""
    return str(seed)


class RealBoomerangRuns(SizeCurveRuns):
    """The teacher's reference on version 1's fixed held-out rows, and each seed's distillation."""

    record_version = RECORD_VERSION
    record_key = staticmethod(record_key)

    _reference: TeacherReference | None = None

    def reference(self) -> TeacherReference:
        if self._reference is None:
            rows = self.settings.heldout_rows_per_source
            names = {source: corpus.measurement_names(items, rows) for source, items in self.sources.items()}
            self._reference = TeacherReference(self.teacher, self.measurement_rows(names, self.settings.max_length))
        return self._reference

    def record(self, seed: int) -> dict[str, Any]:
        """The seed's whole record, read back when it is already kept."""
        kept = kept_record(self.settings.records, record_key(seed), RECORD_VERSION)
        if kept is not None:
            return kept
        undistilled = self.curve(self.init_student(), "undistilled", self.reference())
        distilled_dir = self.train_student(seed, self.work / f"seed-{seed}")
        distilled = self.curve(distilled_dir, f"distilled-seed-{seed}", self.reference())
        record = {
            "record_version": RECORD_VERSION,
            "seed": seed,
            "teacher": self.settings.model,
            "layer_map": json.loads((distilled_dir / LAYER_MAP_FILE).read_text()),
            "validation": {},
            "test": {"distilled": distilled, "undistilled": undistilled},
        }
        write_json(kept_path(self.settings.records, record_key(seed)), record)
        return record
