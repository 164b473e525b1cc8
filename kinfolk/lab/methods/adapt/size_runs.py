"""What every seed of a real-boomerang experiment shares: the teacher, its tokenizer and greedy chat answers, the
text sources, the seed's two-phase training data, the students (layer-dropped, then trained) and the measured curve
of every size between a student and the teacher.

Everything slow is kept under `settings.work` and reused by a rerun: the answers, each trained student (complete
once its directory has a config) and each measured curve (`curves/<label>.json`). An experiment's runs class
(version 1's `RealBoomerangRuns`, version 2's `RealBoomerangControlsRuns`) says which rows a seed is measured on,
which arms it trains and what its record holds.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from functools import cached_property
from pathlib import Path
from typing import Any

import torch

from kinfolk import console
from kinfolk.atomic import write_json
from kinfolk.lab.methods import real_corpus as corpus
from kinfolk.lab.methods.adapt.size_curves import ORDERS, SharedPrefixes, measure_size, patched_sizes
from kinfolk.lab.world.heldout import MeasurementRows, TeacherReference, chat_text, kept_answers, rows_from


def _load(path: Path) -> Any | None:
    return json.loads(path.read_text()) if path.exists() else None


class SizeCurveRuns:
    """The teacher and the pieces a seed's arms are made of. `settings` is a real-boomerang settings dataclass
    (teacher, layers, training budget, chat prompts, work folder)."""

    def __init__(self, settings):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.settings = settings
        self.work = Path(settings.work)
        self.teacher_dir = settings.teacher_dir()
        if not (self.teacher_dir / "config.json").exists():
            raise FileNotFoundError(f"{self.teacher_dir}: no model there (run `make real-models`)")
        self.tokenizer = AutoTokenizer.from_pretrained(self.teacher_dir)
        self.teacher = AutoModelForCausalLM.from_pretrained(self.teacher_dir, dtype=torch.float32).eval()
        self.answers = self._chat_answers()
        self._kept_teacher_prefixes: tuple[TeacherReference, SharedPrefixes] | None = None

    # ------------------------------------------------------------------------------------------ data
    def _chat_answers(self) -> dict[str, str]:
        """The teacher's greedy answer to every instruction (deterministic; kept in the work directory)."""
        instructions = corpus.chat_instructions(self.settings.chat_prompts)
        return kept_answers(self.work / "chat-answers.json", self.teacher, self.tokenizer, instructions,
                            self.settings.answer_tokens)  # fmt: skip

    def doc_source(self) -> dict[str, str]:
        """The documentation items by name (version 1: whole topics)."""
        return corpus.doc_texts()

    @cached_property
    def sources(self) -> dict[str, dict[str, str]]:
        """Every item of every source by name (chat items are the instruction with the teacher's answer); read once
        per process (the code source reads every standard-library module)."""
        chat = {f"chat:{i}": chat_text(self.tokenizer, i, a) for i, a in self.answers.items()}
        return {"docs": self.doc_source(), "code": corpus.code_texts(), "chat": chat}

    def measurement_rows(self, names: Mapping[str, Sequence[str]], max_length: int) -> list[MeasurementRows]:
        """Each source's rows of the held-out items `names[source]` (on chat rows only the answer counts)."""
        rows = []
        for source, items in self.sources.items():
            prefixes = None
            if source == "chat":
                prefixes = [chat_text(self.tokenizer, name.removeprefix("chat:"), None) for name in names[source]]
            texts = [items[name] for name in names[source]]
            rows.append(rows_from(source, self.tokenizer, texts, prefixes, max_length))
        return rows

    def training_data(self, seed: int, steps: int | None = None):
        """The seed's two phases for `steps` steps (default: the settings'): pre-training text (docs and code items)
        and chat SFT rows, drawn by the seed."""
        from datasets import Dataset

        sources = self.sources
        pretraining_rows, sft_rows = self.settings.rows_for(steps or self.settings.steps)
        text = {**corpus.split(sources["docs"])[0], **corpus.split(sources["code"])[0]}
        drawn = corpus.training_draw(list(text), pretraining_rows, seed)
        pretraining = Dataset.from_dict({"text": [text[name] for name in drawn]})
        instructions = [n.removeprefix("chat:") for n in corpus.split(sources["chat"])[0]]
        chosen = corpus.training_draw(instructions, sft_rows, seed)
        sft = Dataset.from_dict({
            "prompt": [[{"role": "user", "content": i}] for i in chosen],
            "completion": [[{"role": "assistant", "content": self.answers[i]}] for i in chosen],
        })  # fmt: skip
        return pretraining, sft

    # ------------------------------------------------------------------------------------------ students
    def curve(self, student: Path, label: str, reference: TeacherReference) -> dict[str, list[dict[str, Any]]]:
        """Every size of `student` patched with the teacher, in both orders, each measured against `reference` (from
        the deepest layer it shares with the teacher or the unpatched student: the full forward's numbers)."""
        path = self.work / "curves" / f"{label}.json"
        cached = _load(path)
        if cached is not None:
            return cached
        from transformers import AutoModelForCausalLM

        unpatched = AutoModelForCausalLM.from_pretrained(student, dtype=torch.float32)
        prefixes = (self._teacher_prefixes(reference), SharedPrefixes(unpatched, reference))
        curves = {}
        for order in ORDERS:
            points, layers = [], []
            for summary, model in patched_sizes(self.teacher_dir, student, order):
                measured, layer = measure_size(model, reference, prefixes)
                points.append({**summary, "sources": {s: asdict(m) for s, m in measured.items()}})
                layers.append(layer)
                del model
            curves[order] = points
            console.stage(f"{label}: {order} measured at {len(points)} sizes, from layers {layers}")
        write_json(path, curves)
        return curves

    def _teacher_prefixes(self, reference: TeacherReference) -> SharedPrefixes:
        """The teacher's layer inputs on `reference`'s rows, captured once for every arm measured on them."""
        if self._kept_teacher_prefixes is None or self._kept_teacher_prefixes[0] is not reference:
            self._kept_teacher_prefixes = None  # free the last reference's before capturing
            self._kept_teacher_prefixes = (reference, SharedPrefixes(self.teacher, reference))
        return self._kept_teacher_prefixes[1]

    def init_student(self) -> Path:
        """The layer-dropped student (the teacher's kept layers, untrained): the same for every seed."""
        from kinfolk.plugins.adapt import InitStudentConfig, merge
        from kinfolk.plugins.adapt.distillation import layer_selection

        path = self.work / "init-student"
        if not (path / "config.json").exists():
            merge(InitStudentConfig(teacher=str(self.teacher_dir), layers=layer_selection(self.settings.layers)),
                  path, overwrite=True, progress=False)  # fmt: skip
        return path

    def train_student(self, seed: int, out: Path, steps: int | None = None, **loss_weights: float) -> Path:
        """The student trained by `kinfolk distil`'s two-phase recipe for `steps` steps (default: the settings')
        under `out` (its `distilled` folder), with the distillation terms' weights `loss_weights` (`kl_weight`,
        `cosine_weight`) where given."""
        from kinfolk.plugins.adapt.distillation import DISTILLED, distil_student
        from kinfolk.trainers import LayerDistillationConfig

        if (out / DISTILLED / "config.json").exists():
            return out / DISTILLED
        s = self.settings
        steps = steps or s.steps
        args = LayerDistillationConfig(
            output_dir=str(out / "training"), max_steps=steps, per_device_train_batch_size=s.batch_size,
            learning_rate=s.learning_rate, pretraining_fraction=s.pretraining_fraction, max_length=s.max_length,
            seed=seed, data_seed=seed, save_strategy="no", logging_steps=10, report_to=[], use_cpu=True,
            bf16=False, dataloader_num_workers=0, disable_tqdm=True, **loss_weights,
        )  # fmt: skip
        pretraining, sft = self.training_data(seed, steps)
        console.stage(f"seed {seed}: training {out.name} for {steps} steps")
        return distil_student(self.teacher_dir, out, s.layers, args, pretraining=pretraining, sft=sft)
