"""One seed of real-boomerang version 3: its draw of held-out rows (64 measured and 16 validation rows per source,
apart), the teacher's reference on each, the distilled student, and cross-entropy-only students at equal steps, at
equal training FLOPs and climbed up the budget ladder until their unpatched student's validation log perplexity
stops improving; every arm measured at every size in both patch orders on the measured rows.

A process claims the whole seed while it makes it (`kinfolk.claims`); every trained student and measured
curve is kept under `settings.work` (a budget trained once serves every arm that needs it), with its training's
seconds beside it, and the seed's record goes to `settings.records/<seed>.json` once whole. The shared pieces are
`kinfolk.lab.methods.adapt.size_runs`'s.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from kinfolk.atomic import write_json
from kinfolk.claims import claimed
from kinfolk.lab.experiments.real_boomerang_compute.settings import ARMS, LOSS_WEIGHTS, RealBoomerangComputeSettings
from kinfolk.lab.methods import real_corpus as corpus
from kinfolk.lab.methods.adapt.size_curves import size_value
from kinfolk.lab.methods.adapt.size_runs import SizeCurveRuns
from kinfolk.lab.methods.compute import converged_budget, multiplying_parameters
from kinfolk.lab.protocol.records import kept_path, kept_record
from kinfolk.lab.world.heldout import TeacherReference

RECORD_VERSION = 1
SECONDS_FILE = "training-seconds.json"


def record_key(seed: int) -> str:
    """A seed's key among the kept records."""
    return str(seed)


class RealBoomerangComputeRuns(SizeCurveRuns):
    settings: RealBoomerangComputeSettings
    record_version = RECORD_VERSION
    record_key = staticmethod(record_key)

    def __init__(self, settings: RealBoomerangComputeSettings):
        super().__init__(settings)
        self._references: dict[tuple[int, str], TeacherReference] = {}

    def doc_source(self) -> dict[str, str]:
        """Documentation topics in chunks (version 2's): whole topics leave too few held out."""
        return corpus.doc_chunks()

    def drawn_names(self, seed: int) -> dict[str, dict[str, list[str]]]:
        """The seed's held-out rows by split ("test": measured, "validation": the ladder's) and source, apart."""
        measured, validation = self.settings.measured_rows_per_source, self.settings.validation_rows_per_source
        drawn = {source: corpus.seed_measurement_names(items, measured + validation, seed)
                 for source, items in self.sources.items()}  # fmt: skip
        return {
            "test": {source: names[:measured] for source, names in drawn.items()},
            "validation": {source: names[measured:] for source, names in drawn.items()},
        }

    def reference(self, seed: int, split: str) -> TeacherReference:
        """The teacher's log-probabilities on the seed's rows of `split` (one seed's at a time)."""
        if (seed, split) not in self._references:
            self._references = {key: ref for key, ref in self._references.items() if key[0] == seed}
            rows = self.measurement_rows(self.drawn_names(seed)[split], self.settings.measured_length)
            self._references[(seed, split)] = TeacherReference(self.teacher, rows)
        return self._references[(seed, split)]

    def trained(self, seed: int, loss: str, steps: int) -> tuple[Path, float]:
        """The seed's student trained with `loss` for `steps` steps, and the seconds its training took."""
        out = self.work / f"seed-{seed}" / f"{loss}-{steps}"
        start = time.perf_counter()
        student = self.train_student(seed, out, steps, **LOSS_WEIGHTS[loss])
        if not (out / SECONDS_FILE).exists():
            write_json(out / SECONDS_FILE, {"seconds": round(time.perf_counter() - start, 1)})
        return student, json.loads((out / SECONDS_FILE).read_text())["seconds"]

    def validation_nll(self, seed: int, student: Path) -> float:
        """The unpatched student's log perplexity on the seed's validation rows (mean over sources)."""
        import torch
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(student, dtype=torch.float32).eval()
        measured = self.reference(seed, "validation").measure(model)
        return size_value({"sources": {s: asdict(m) for s, m in measured.items()}}, "nll")

    def ladder(self, seed: int) -> list[dict[str, Any]]:
        """The cross-entropy student's validation log perplexity at each budget, climbed until it stops improving."""
        s, climbed = self.settings, []
        for steps in s.ce_budgets:
            student, _ = self.trained(seed, "ce-only", steps)
            climbed.append({"steps": steps, "nll": self.validation_nll(seed, student)})
            rungs = [(rung["steps"], rung["nll"]) for rung in climbed]
            if len(climbed) > 1 and not converged_budget(rungs, s.stop_tolerance, higher_is_better=False)[1]:
                break
        return climbed

    def make(self, seed: int) -> dict[str, Any]:
        s = self.settings
        ladder = self.ladder(seed)
        rungs = [(rung["steps"], rung["nll"]) for rung in ladder]
        converged, _ = converged_budget(rungs, s.stop_tolerance, higher_is_better=False)
        curves, seconds = {}, {}
        for arm, (loss, budget_field) in ARMS.items():
            steps = getattr(s, budget_field) if budget_field else converged
            student, seconds[arm] = self.trained(seed, loss, steps)
            curves[arm] = self.curve(student, f"{loss}-{steps}-seed-{seed}", self.reference(seed, "test"))
        return {
            "record_version": RECORD_VERSION,
            "seed": seed,
            "teacher": s.model,
            "parameters": {  # the weights each multiplies per token: what a step's FLOPs are counted from
                "student": multiplying_parameters(self.teacher.config, layers=s.patched_blocks),
                "teacher": multiplying_parameters(self.teacher.config),
            },
            "measured": self.drawn_names(seed)["test"],
            "training_seconds": seconds,
            "validation": {"rows": self.drawn_names(seed)["validation"], "ladder": ladder},
            "test": curves,
        }

    def record(self, seed: int) -> dict[str, Any] | None:
        """The seed's whole record, read back when kept; None while another live process makes it."""
        kept = kept_record(self.settings.records, record_key(seed), RECORD_VERSION)
        if kept is not None:
            return kept
        with claimed(self.work / f"seed-{seed}") as ours:
            if not ours:
                return None
            record = self.make(seed)
            write_json(kept_path(self.settings.records, record_key(seed)), record)
            return record
