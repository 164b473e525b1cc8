"""One seed of the real-atlas experiment: its draw of the text, the frozen model's reference on the measured rows,
the atlas fitted on the retained training rows, and one training run per method, measured at every checkpoint.

A run's checkpoint (`point`) holds, per split (validation, test), the target `gain` (held-out code NLL per token,
frozen minus current), and per retained source the `kl` (KL(frozen ‖ current) per token, teacher-forced on the
source's rows; on chat rows the model's own answers) and the `nll` (so the forgetting PEFT reports, held-out
cross-entropy after minus before, is `nll` minus the frozen `nll`). Step 0 is the untrained adapter: its KL is the
floor the method's numerical path leaves on an identity update.

Everything slow is kept under `settings.work` and reused by a rerun (chat answers, each finished run, each
checkpoint's adapter); a seed's record, its measured rows (`contexts.json`) and the adapters its selection chose are
written under `settings.records/<seed>/` once every method's run is kept.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from functools import cached_property
from pathlib import Path
from typing import Any

import torch

from kinfolk import console
from kinfolk.atomic import atomic_directory, write_json
from kinfolk.claims import claimed
from kinfolk.lab.experiments.real_atlas import corpus
from kinfolk.lab.experiments.real_atlas.settings import BASELINE, PRIMARY_LEVEL, RealAtlasSettings
from kinfolk.lab.methods.cache import cached_json
from kinfolk.lab.methods.selection import checkpoints_at_levels
from kinfolk.lab.protocol.records import kept_path, kept_record
from kinfolk.lab.world.heldout import TeacherReference, chat_text, kept_answers, rows_from
from kinfolk.lab.world.training import lab_trainer

RECORD_VERSION = 1
MEASURED = ("code", *corpus.RETAINED_SOURCES)


def run_name(method: str, learning_rate: float, strength: float | None) -> str:
    """The run's name (and folder) in a seed's work directory.

    >>> run_name("lora+output-kl", 0.001, 3.0)
    'lora+output-kl-lr0.001-s3'
    """
    return f"{method}-lr{learning_rate:g}" + ("" if strength is None else f"-s{strength:g}")


def record_key(seed: int) -> str:
    """A seed's key among the kept records: its folder holds the record, its measured rows and chosen adapters."""
    return f"{seed}/record"


class SeedState:
    """What every run of one seed shares: its draw, the measured rows with the frozen reference, the atlas."""

    def __init__(self, runs: RealAtlasRuns, seed: int):
        s = runs.settings
        self.seed, self.splits = seed, runs.splits
        self.draw = corpus.draw(runs.sources, seed)
        self.rows, self.contexts = [], {}
        for split in runs.splits:
            for source in MEASURED:
                count = s.code_rows if source == "code" else s.retained_rows
                names = self.draw.take(source, split, count)
                prefixes = runs.chat_prompts(names) if source == "chat" else None
                texts = [runs.sources[source][name] for name in names]
                self.rows.append(rows_from(f"{split}/{source}", runs.tokenizer, texts, prefixes, s.max_length))
                self.contexts[f"{split}/{source}"] = [
                    {"name": n, "text": t} | ({"prompt": p} if prefixes else {})
                    for n, t, p in zip(names, texts, prefixes or [None] * len(names))
                ]
        self.reference = TeacherReference(runs.frozen, self.rows)
        self.frozen_nll = {part: m.nll for part, m in self.reference.measure(runs.frozen).items()}
        retained = [
            runs.sources[source][name]
            for source in corpus.RETAINED_SOURCES
            for name in self.draw.training_rows(source, s.fit_rows)
        ]
        from datasets import Dataset

        self.fit_data = Dataset.from_dict({"text": retained})
        code = runs.sources["code"]
        rows = self.draw.training_rows("code", s.steps * s.batch_size)
        self.target_data = Dataset.from_dict({"text": [code[name] for name in rows]})
        self.atlas = runs.fit(self)

    def point(self, model, step: int) -> dict[str, Any]:
        measured = self.reference.measure(model)
        point: dict[str, Any] = {"step": step}
        for split in self.splits:
            code = measured[f"{split}/code"]
            point[split] = {
                "gain": self.frozen_nll[f"{split}/code"] - code.nll,
                "kl": {source: measured[f"{split}/{source}"].kl for source in corpus.RETAINED_SOURCES},
                "nll": {source: measured[f"{split}/{source}"].nll for source in corpus.RETAINED_SOURCES},
            }
        return point


class RealAtlasRuns:
    """The frozen model, its tokenizer and chat answers (shared by every seed), and each seed's runs, measured on
    `splits` (the pilot measures validation only)."""

    record_version = RECORD_VERSION
    record_key = staticmethod(record_key)

    def __init__(self, settings: RealAtlasSettings, splits: tuple[str, ...] = corpus.SPLITS):
        from transformers import AutoTokenizer

        from kinfolk.plugins.atlas.model import default_layer

        self.settings, self.splits = settings, splits
        self.work = Path(settings.work)
        self.model_dir = settings.model_dir()
        if not (self.model_dir / "config.json").exists():
            raise FileNotFoundError(f"{self.model_dir}: no model there (run `make real-models`)")
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_dir)
        self.frozen = self.load()
        layers = self.frozen.config.num_hidden_layers
        self.layer = settings.layer if settings.layer is not None else default_layer(layers)
        self._states: dict[int, SeedState] = {}

    def load(self) -> torch.nn.Module:
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM.from_pretrained(self.model_dir, dtype=torch.float32).eval()

    # ------------------------------------------------------------------------------------------ data
    @cached_property
    def answers(self) -> dict[str, str]:
        """The frozen model's greedy answer to every instruction (deterministic; kept in the work directory)."""
        instructions = list(corpus.chat_items(self.settings.chat_prompts).values())
        return kept_answers(self.work / "chat-answers.json", self.frozen, self.tokenizer, instructions,
                            self.settings.answer_tokens)  # fmt: skip

    @cached_property
    def sources(self) -> dict[str, dict[str, str]]:
        """Every item of every source by name; chat items are the instruction with the model's own answer."""
        chat = {name: chat_text(self.tokenizer, i, self.answers[i]) for name, i in self._instructions().items()}
        return {**corpus.text_sources(self.settings.prose_path()), "chat": chat}

    def _instructions(self) -> dict[str, str]:
        return corpus.chat_items(self.settings.chat_prompts)

    def chat_prompts(self, names: list[str]) -> list[str]:
        return [chat_text(self.tokenizer, self._instructions()[name], None) for name in names]

    def state(self, seed: int) -> SeedState:
        if seed not in self._states:
            console.stage(f"seed {seed}: measured rows, the frozen reference and the atlas")
            self._states[seed] = SeedState(self, seed)
        return self._states[seed]

    # ------------------------------------------------------------------------------------------ adapters
    def atlas_config(self):
        """ATLAS's adapter at the shared placement and rank: every method's placement (`adapter_model`)."""
        from kinfolk.plugins.atlas import AtlasConfig

        return AtlasConfig(r=self.settings.rank, layers_to_transform=[self.layer],
                           target_modules=[self.settings.module])  # fmt: skip

    def fit(self, state: SeedState) -> dict[str, torch.Tensor]:
        """The atlas of the adapted module, fitted on the seed's retained training rows."""
        from peft import get_peft_model

        from kinfolk.lab.methods.atlas.runs import atlas_buffers
        from kinfolk.plugins.atlas import fit_atlas

        template = get_peft_model(self.load(), self.atlas_config())
        fit_atlas(template, state.fit_data, tokenizer=self.tokenizer, max_length=self.settings.max_length,
                  seed=state.seed, progress=False)  # fmt: skip
        return atlas_buffers(template)

    def build(self, state: SeedState, method: str) -> torch.nn.Module:
        """The frozen model with `method`'s adapter at the shared placement (atlas loaded for ATLAS adapters)."""
        from transformers import set_seed

        from kinfolk.lab.methods.atlas.runs import adapter_model

        base = self.load()
        set_seed(state.seed)  # the adapter's random initialisation: the seed's, the same for every method
        return adapter_model(base, method, self.atlas_config(), state.atlas)

    # ------------------------------------------------------------------------------------------ runs
    def train(self, seed: int, method: str, learning_rate: float, strength: float | None, keep: Path | None):
        """One run: the method learns the code target, measured at every checkpoint (adapters kept under `keep`)."""
        from transformers import TrainerCallback

        s, state = self.settings, self.state(seed)
        model = self.build(state, method)
        trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        checkpoints, points = set(s.checkpoints()), []

        def checkpoint(model, step: int) -> None:
            points.append(state.point(model, step))
            if keep is not None:
                with atomic_directory(keep / f"step-{step}", overwrite=True) as staging:
                    model.save_pretrained(staging)
            model.train()

        class Checkpoints(TrainerCallback):
            def on_train_begin(self, args, state, control, model=None, **kwargs):
                checkpoint(model, 0)

            def on_step_end(self, args, state, control, model=None, **kwargs):
                if state.global_step in checkpoints:
                    checkpoint(model, state.global_step)

        regulariser = {"output_kl_coef": strength} if strength is not None else {}
        start = time.perf_counter()
        with tempfile.TemporaryDirectory() as scratch:
            trainer = lab_trainer(model, state.target_data, self.tokenizer, scratch, s.steps, learning_rate,
                                  batch_size=s.batch_size, prompt_loss_weight=0.0, seed=seed, progress=False,
                                  retained_dataset=state.fit_data if regulariser else None, max_length=s.max_length,
                                  **regulariser)  # fmt: skip
            trainer.add_callback(Checkpoints())
            trainer.train()
        return {
            "method": method,
            "learning_rate": learning_rate,
            "strength": strength,
            "trainable": trainable,
            "points": points,
            "seconds": round(time.perf_counter() - start, 1),
        }

    def where(self, seed: int, method: str, learning_rate: float, strength: float | None) -> Path:
        return self.work / f"seed-{seed}" / run_name(method, learning_rate, strength)

    def run(
        self, seed: int, method: str, learning_rate: float, strength: float | None = None
    ) -> dict[str, Any] | None:
        """One run, kept under the work directory (with its checkpoints' adapters) once finished; None while another
        live process has claimed it (so processes started alike share the runs instead of repeating them)."""
        name = run_name(method, learning_rate, strength)
        where = self.where(seed, method, learning_rate, strength)
        if (where / "run.json").exists():
            return json.loads((where / "run.json").read_text())
        with claimed(where) as ours:
            if not ours:
                console.stage(f"seed {seed}: {name} is another process's")
                return None
            console.stage(f"seed {seed}: {name}")
            return cached_json(where / "run.json", lambda: self.train(seed, method, learning_rate, strength, where))

    def _planned(self, method: str) -> tuple[float, float | None]:
        """The plan's learning rate (and, for Output-KL, strength) of `method`."""
        s = self.settings
        return s.learning_rates[method], (s.output_kl_coef if method == "lora+output-kl" else None)

    def method_run(self, seed: int, method: str) -> dict[str, Any] | None:
        return self.run(seed, method, *self._planned(method))

    def run_kept(self, seed: int, method: str) -> bool:
        return (self.where(seed, method, *self._planned(method)) / "run.json").exists()

    def record(self, seed: int) -> dict[str, Any] | None:
        """The seed's record (every method's run), its measured rows and chosen adapters, kept once whole."""
        kept = kept_record(self.settings.records, record_key(seed), RECORD_VERSION)
        if kept is not None:
            return kept
        runs = {method: self.method_run(seed, method) for method in self.settings.methods}
        if any(run is None for run in runs.values()):
            return None  # another process is finishing one of them, and will write the record
        state = self.state(seed)
        record = {
            "record_version": RECORD_VERSION,
            "seed": seed,
            "model": self.settings.model,
            "layer": self.layer,
            "runs": runs,
        }
        path = kept_path(self.settings.records, record_key(seed))
        write_json(path.parent / "contexts.json", state.contexts)
        self.keep_chosen_adapters(record, path.parent / "adapters")
        write_json(path, record)
        return record

    def keep_chosen_adapters(self, record: dict[str, Any], out: Path) -> None:
        """Copy, per method, the checkpoint the experiment's selection chooses (validation only, the same rule) at the
        primaries' level."""
        validation = {
            m: [{"step": p["step"], **p["validation"]} for p in run["points"]] for m, run in record["runs"].items()
        }
        chosen = checkpoints_at_levels(validation, self.settings.gain_levels, BASELINE)["checkpoints"]
        for level, steps in chosen.items():
            if level != PRIMARY_LEVEL:
                continue  # an ATLAS adapter carries its atlas (0.7 MB here): the primaries' level only
            for method, step in steps.items():
                if step is None:
                    continue
                run = record["runs"][method]
                source = self.where(record["seed"], method, run["learning_rate"], run["strength"]) / f"step-{step}"
                with atomic_directory(out / f"{level}-{method}", overwrite=True) as staging:
                    shutil.copytree(source, staging, dirs_exist_ok=True)
