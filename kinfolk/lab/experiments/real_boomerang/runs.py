"""One seed of the real-boomerang experiment: the teacher's chat answers (once), the undistilled student's curve
(once: it does not depend on the seed), the seed's two-phase distillation and its curve, in both patch orders.

Everything slow is kept under `settings.work` and reused by a rerun (answers, measured curves; a distillation
whose student is complete); each seed's record (`settings.records/<seed>.json`: per size and source, the depth,
parameters, log perplexity, KL to the teacher and agreement) is written atomically once the seed is whole.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from functools import cached_property
from pathlib import Path
from typing import Any

import torch

from kinfolk import console
from kinfolk.atomic import write_json
from kinfolk.lab.experiments.real_boomerang.settings import BoomerangSettings
from kinfolk.lab.experiments.real_boomerang.sizes import ORDERS, patched_sizes
from kinfolk.lab.methods import real_corpus as corpus
from kinfolk.lab.protocol.records import kept_path, kept_record
from kinfolk.lab.world.heldout import TeacherReference, chat_text, kept_answers, rows_from
from kinfolk.plugins.adapt.layer_map import LAYER_MAP_FILE

RECORD_VERSION = 1


def _load(path: Path) -> Any | None:
    return json.loads(path.read_text()) if path.exists() else None


def record_key(seed: int) -> str:
    """A seed's key among the kept records."""
    return str(seed)


class RealBoomerangRuns:
    """The shared pieces of every seed (teacher, tokenizer, answers, measurement rows) and each seed's runs."""

    def __init__(self, settings: BoomerangSettings):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.settings = settings
        self.work = Path(settings.work)
        self.teacher_dir = settings.teacher_dir()
        if not (self.teacher_dir / "config.json").exists():
            raise FileNotFoundError(f"{self.teacher_dir}: no model there (run `make real-models`)")
        self.tokenizer = AutoTokenizer.from_pretrained(self.teacher_dir)
        self.teacher = AutoModelForCausalLM.from_pretrained(self.teacher_dir, dtype=torch.float32).eval()
        self.answers = self._chat_answers()
        self._reference: TeacherReference | None = None

    # ------------------------------------------------------------------------------------------ data
    def _chat_answers(self) -> dict[str, str]:
        """The teacher's greedy answer to every instruction (deterministic; kept in the work directory)."""
        instructions = corpus.chat_instructions(self.settings.chat_prompts)
        return kept_answers(self.work / "chat-answers.json", self.teacher, self.tokenizer, instructions,
                            self.settings.answer_tokens)  # fmt: skip

    @cached_property
    def sources(self) -> dict[str, dict[str, str]]:
        """Every item of every source by name (chat items are the instruction with the teacher's answer); read once
        per process (the code source reads every standard-library module)."""
        chat = {f"chat:{i}": chat_text(self.tokenizer, i, a) for i, a in self.answers.items()}
        return {"docs": corpus.doc_texts(), "code": corpus.code_texts(), "chat": chat}

    def reference(self) -> TeacherReference:
        if self._reference is None:
            rows = []
            for source, items in self.sources.items():
                names = corpus.measurement_names(items, self.settings.heldout_rows_per_source)
                prefixes = None
                if source == "chat":
                    prefixes = [chat_text(self.tokenizer, name.removeprefix("chat:"), None) for name in names]
                texts = [items[name] for name in names]
                rows.append(rows_from(source, self.tokenizer, texts, prefixes, self.settings.max_length))
            self._reference = TeacherReference(self.teacher, rows)
        return self._reference

    def training_data(self, seed: int):
        """The seed's two phases: pre-training text (docs and code items) and chat SFT rows, drawn by the seed."""
        from datasets import Dataset

        sources = self.sources
        text = {**corpus.split(sources["docs"])[0], **corpus.split(sources["code"])[0]}
        drawn = corpus.training_draw(list(text), self.settings.pretraining_rows, seed)
        pretraining = Dataset.from_dict({"text": [text[name] for name in drawn]})
        instructions = [n.removeprefix("chat:") for n in corpus.split(sources["chat"])[0]]
        chosen = corpus.training_draw(instructions, self.settings.sft_rows, seed)
        sft = Dataset.from_dict({
            "prompt": [[{"role": "user", "content": i}] for i in chosen],
            "completion": [[{"role": "assistant", "content": self.answers[i]}] for i in chosen],
        })  # fmt: skip
        return pretraining, sft

    # ------------------------------------------------------------------------------------------ runs
    def curve(self, student: Path, label: str) -> dict[str, list[dict[str, Any]]]:
        """Every size of `student` patched with the teacher, in both orders, each measured."""
        path = self.work / "curves" / f"{label}.json"
        cached = _load(path)
        if cached is not None:
            return cached
        reference = self.reference()
        curves = {}
        for order in ORDERS:
            points = []
            for summary, model in patched_sizes(self.teacher_dir, student, order):
                measured = reference.measure(model)
                points.append({**summary, "sources": {s: asdict(m) for s, m in measured.items()}})
                del model
            curves[order] = points
            console.stage(f"{label}: {order} measured at {len(points)} sizes")
        write_json(path, curves)
        return curves

    def init_student(self) -> Path:
        from kinfolk.plugins.adapt import InitStudentConfig, merge
        from kinfolk.plugins.adapt.distillation import layer_selection

        path = self.work / "init-student"
        if not (path / "config.json").exists():
            merge(InitStudentConfig(teacher=str(self.teacher_dir), layers=layer_selection(self.settings.layers)),
                  path, overwrite=True, progress=False)  # fmt: skip
        return path

    def distil(self, seed: int) -> Path:
        from kinfolk.plugins.adapt.distillation import DISTILLED, distil_student
        from kinfolk.trainers import LayerDistillationConfig

        out = self.work / f"seed-{seed}"
        if (out / DISTILLED / "config.json").exists():
            return out / DISTILLED
        s = self.settings
        args = LayerDistillationConfig(
            output_dir=str(out / "training"), max_steps=s.steps, per_device_train_batch_size=s.batch_size,
            learning_rate=s.learning_rate, pretraining_fraction=s.pretraining_fraction, max_length=s.max_length,
            seed=seed, data_seed=seed, save_strategy="no", logging_steps=10, report_to=[], use_cpu=True,
            bf16=False, dataloader_num_workers=0, disable_tqdm=True,
        )  # fmt: skip
        pretraining, sft = self.training_data(seed)
        console.stage(f"seed {seed}: distilling for {s.steps} steps")
        return distil_student(self.teacher_dir, out, s.layers, args, pretraining=pretraining, sft=sft)

    def record(self, seed: int) -> dict[str, Any]:
        """The seed's whole record, read back when it is already kept."""
        kept = kept_record(self.settings.records, record_key(seed), RECORD_VERSION)
        if kept is not None:
            return kept
        undistilled = self.curve(self.init_student(), "undistilled")
        distilled_dir = self.distil(seed)
        distilled = self.curve(distilled_dir, f"distilled-seed-{seed}")
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
