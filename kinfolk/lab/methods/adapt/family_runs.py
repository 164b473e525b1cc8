"""One ADAPT lab family's stages (`AdaptFamily`): students, sizes, curves, transfer and routing, each kept."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from datasets import Dataset

from kinfolk.atomic import atomic_file, fingerprint
from kinfolk.lab.methods.adapt.agreement import teacher_agreement
from kinfolk.lab.methods.adapt.settings import (
    BASE,
    LOSS_WEIGHTS,
    MEASURING_SETTINGS,
    METHODS,
    PHASES,
    ROUTED,
    ROUTING_POLICIES,
    ROUTING_THRESHOLDS,
    SCORED,
    TRAINING_SETTINGS,
    AdaptSettings,
    concordance,
    format_of,
    graded_problems,
    largest_drop,
)
from kinfolk.lab.methods.cache import cached_json, settings_key
from kinfolk.lab.world import corpus
from kinfolk.lab.world.evaluate import MAX_NEW_TOKENS, generate_responses, score_responses
from kinfolk.lab.world.family import Family
from kinfolk.lab.world.skills import ALL_SKILLS, GRADED
from kinfolk.lab.world.tokenizer import MAX_LENGTH
from kinfolk.lab.world.training import single_threaded


class AdaptFamily:
    """One family's ADAPT runs under `work`: distillations, patched sizes and measurements, each kept on disk by
    what determines it, so a stopped family resumes and a rerun with other settings reuses what it can."""

    def __init__(
        self,
        family: Family,
        work: Path,
        settings: AdaptSettings,
        progress: bool = False,
        seed: int | None = None,
        scored: list[str] = SCORED,
        base_sft: Callable[[int], Dataset] | None = None,
    ):
        """`seed` seeds every distillation (default: the family's); `scored` are the skills every size is scored
        on; `base_sft(n)` gives the base student's `n` SFT rows (default: the variants' own post-training prompts in
        the preferred format, version 1's choice)."""
        self.family, self.settings, self.progress = family, settings, progress
        self.seed = family.config.seed if seed is None else seed
        self.scored = list(scored)
        self.base_sft = base_sft or (lambda n: family.instruct_data(n, format_of(BASE)))
        self.tokenizer = family.tokenizer()
        self._contexts: dict[str, dict[str, Any]] = {}
        # Models live under a key of what trains them, measurements carry a key of what measures them.
        trained_by = {name: getattr(settings, name) for name in TRAINING_SETTINGS}
        self.work = Path(work) / f"trained-{settings_key(trained_by)}"
        measuring = {name: getattr(settings, name) for name in MEASURING_SETTINGS}
        self.measured_by = settings_key(measuring | ({"scored": self.scored} if self.scored != SCORED else {}))

    def _say(self, message: str) -> None:
        if self.progress:
            print(f"[adapt] family {self.family.config.seed}: {message}", flush=True)

    def teacher_dir(self, name: str) -> Path:
        return self.family.models[name]

    # --- students -------------------------------------------------------------------------------------------
    def training_data(self, teacher: str, phases: str, steps: int) -> tuple[Dataset | None, Dataset | None]:
        """(pre-training text, SFT data) of a distillation: the family's pre-training rows as plain text (every
        token trained), the teacher's own post-training rows (its format; the base: the preferred one)."""
        from kinfolk.trainers.layer_distillation_trainer import phase_steps

        rows = self.settings.batch_size
        if phases == "two-phase":
            pretraining_steps, sft_steps = phase_steps(steps, self.settings.pretraining_fraction)
        else:
            pretraining_steps, sft_steps = (steps, 0) if phases == "pretraining" else (0, steps)
        text = None
        if pretraining_steps:
            rows_of = self.family.pretraining(rows * pretraining_steps)
            text = Dataset.from_dict({"text": [p + c for p, c in zip(rows_of["prompt"], rows_of["completion"])]})
        if not sft_steps:
            return text, None
        if teacher == BASE:
            return text, self.base_sft(rows * sft_steps)
        return text, self.family.instruct_data(rows * sft_steps, format_of(teacher))

    def distillation_config(self, out: Path, steps: int, loss: str = "distilled"):
        """The `LayerDistillationConfig` of a distillation into `out`: `loss` is "distilled" (ADAPT's loss: CE, KL
        and block cosine at the trainer's defaults) or "ce-only" (the same run with the two distillation terms'
        weights at 0, `LOSS_WEIGHTS`)."""
        from kinfolk.trainers import LayerDistillationConfig

        return LayerDistillationConfig(
            output_dir=str(out / "training"),
            use_cpu=True,
            bf16=False,
            max_steps=steps,
            per_device_train_batch_size=self.settings.batch_size,
            learning_rate=self.settings.learning_rate,
            warmup_steps=min(50, steps // 10),
            pretraining_fraction=self.settings.pretraining_fraction,
            max_length=MAX_LENGTH,
            save_strategy="no",
            report_to=[],
            seed=self.seed,
            data_seed=self.seed,
            logging_steps=max(1, steps // 10),
            disable_tqdm=True,
            gradient_checkpointing=False,
            **LOSS_WEIGHTS[loss],
        )

    def distilled(self, teacher: str, phases: str, steps: int, loss: str = "distilled") -> Path:
        """`kinfolk distil` of `teacher`'s student (`phases`, `steps`, `loss`): its directory (init-student,
        distilled, delta). A "ce-only" student is trained on the same rows, in the same order, with the same
        schedule."""
        from kinfolk.plugins.adapt.distillation import distil_student

        out = self.work / "distil" / f"{teacher}-{phases}-{steps}{'' if loss == 'distilled' else f'-{loss}'}"
        if (out / "delta" / "adapt_delta.json").exists():  # written last
            return out
        self._say(f"distilling {teacher}'s student ({phases}, {steps} steps, {loss})")
        text, sft = self.training_data(teacher, phases, steps)
        config = self.distillation_config(out, steps, loss)
        distil_student(self.teacher_dir(teacher), out, self.settings.layers, config, pretraining=text, sft=sft)
        return out

    def init(self, variant: str) -> Path:
        """The variant's layer-dropped student before any training (`kinfolk merge init-student`)."""
        from kinfolk.plugins.adapt import InitStudentConfig, merge
        from kinfolk.plugins.adapt.distillation import layer_selection

        out = self.work / "init" / variant
        if not (out / "config.json").exists():
            config = InitStudentConfig(
                teacher=str(self.teacher_dir(variant)), layers=layer_selection(self.settings.layers)
            )
            merge(config, out, overwrite=True, progress=False)
        return out

    def student(self, method: str, variant: str, steps: int) -> Path:
        """The student a method patches the variant's blocks into."""
        from kinfolk.plugins.adapt import ApplyDeltaConfig, merge

        if method in LOSS_WEIGHTS:  # the variant's own student: "distilled" (ADAPT (distilled)) or "ce-only"
            return self.distilled(variant, "two-phase", steps, loss=method) / "distilled"
        if method == "cross-patch":
            return self.distilled(BASE, "two-phase", steps) / "distilled"
        phases = {"weight-delta": "two-phase", "pretraining-delta": "pretraining", "sft-delta": "sft"}[method]
        out = self.work / "students" / f"{method}-{variant}-{steps}"
        if not (out / "config.json").exists():
            delta = self.distilled(BASE, phases, steps) / "delta"
            config = ApplyDeltaConfig(init=str(self.init(variant)), delta=str(delta))
            merge(config, out, overwrite=True, progress=False)
        return out

    def sizes(self, method: str, variant: str, steps: int, order: str) -> Path:
        """Every size k = 0..M of the method's family, patched in `order` (`kinfolk merge patch --all`)."""
        from kinfolk.plugins.adapt import PatchConfig, merge

        out = self.work / "sizes" / f"{method}-{variant}-{steps}-{order}"
        if not (out / "family.json").exists():
            student = self.student(method, variant, steps)
            config = PatchConfig(
                teacher=str(self.teacher_dir(variant)),
                student=str(student),
                order=order,
                # the cross-patch: the variant's blocks into the base's student (its layer map records the base)
                allow_other_teacher=method == "cross-patch",
            )
            merge(config, out, overwrite=True, all_sizes=True, progress=False)
        return out

    # --- measurement ----------------------------------------------------------------------------------------
    def context(self, variant: str) -> dict[str, Any]:
        """What every model of a variant's families is measured with: the variant (loaded once), its format,
        test and validation problems, and test-split examples in its format for KL and cosine."""
        if variant not in self._contexts:
            from transformers import AutoModelForCausalLM

            from kinfolk.batches import retained_batches

            seed = self.family.config.seed
            examples = corpus.ideal_dataset(
                self.scored, self.settings.kl_examples, seed + 6, format_of(variant), "test"
            )
            self._contexts[variant] = {
                "teacher": AutoModelForCausalLM.from_pretrained(self.teacher_dir(variant)).eval(),
                "format": format_of(variant),
                "batches": retained_batches(examples, self.tokenizer, max_length=MAX_LENGTH, batch_size=64),
                "problems": {
                    split: {skill: corpus.eval_problems(skill, n, seed, split) for skill in self.scored}
                    for split, n in (
                        ("test", self.settings.eval_problems),
                        ("validation", self.settings.validation_problems),
                    )
                },
            }
        return self._contexts[variant]

    def measure(self, path: Path, variant: str) -> dict[str, Any]:
        """Accuracy (test, per skill and mean; validation mean), KL and cosine to the variant; kept beside `path`."""

        def compute() -> dict[str, Any]:
            from transformers import AutoModelForCausalLM

            from kinfolk.plugins.adapt import LayerMap

            context = self.context(variant)
            model = AutoModelForCausalLM.from_pretrained(path).eval()
            accuracy = {}
            for split, problems in context["problems"].items():
                per_skill = {}
                for skill, rows in problems.items():
                    responses = generate_responses(model, self.tokenizer, rows["prompt"])
                    scores = score_responses(ALL_SKILLS[skill], rows["prompt"], responses, context["format"])
                    per_skill[skill] = scores["accuracy"]
                per_skill["mean"] = float(np.mean([per_skill[skill] for skill in self.scored]))
                accuracy[split] = per_skill
            aligned = LayerMap.load(path).aligned_teacher_layers
            return {
                "layers": model.config.num_hidden_layers,
                "parameters": sum(p.numel() for p in model.parameters()),
                "test": accuracy["test"],
                "validation": accuracy["validation"]["mean"],
                **teacher_agreement(model, context["teacher"], context["batches"], aligned),
            }

        return cached_json(path.parent / f"{path.name}.measured-{self.measured_by}.json", compute)

    def curve(self, method: str, variant: str, steps: int) -> dict[str, Any]:
        """Every size of the method's family in every order, and per size the order with the better validation
        accuracy (the first order on ties): the family's curve."""
        orders = {}
        for order in self.settings.orders:
            directory = self.sizes(method, variant, steps, order)
            entries = json.loads((directory / "family.json").read_text())["models"]
            orders[order] = [{"k": e["k"], "dir": str(directory / e["dir"]), **self.measure(directory / e["dir"], variant)}
                             for e in entries]  # fmt: skip
        chosen = []
        for k in range(len(next(iter(orders.values())))):
            order = max(
                self.settings.orders, key=lambda o: (orders[o][k]["validation"], -self.settings.orders.index(o))
            )
            chosen.append({"order": order, **orders[order][k]})
        accuracy = [size["test"]["mean"] for size in chosen]
        kl = [size["kl"] for size in chosen]
        return {
            "orders": orders,
            "chosen": chosen,
            "accuracy_concordance": concordance(accuracy),
            "kl_concordance": concordance([-value for value in kl]),
            "largest_accuracy_drop": largest_drop(accuracy),
            "student_gap": accuracy[-1] - accuracy[0],
        }

    # --- stages -------------------------------------------------------------------------------------------
    def interpolation(self) -> dict[str, Any]:
        return {
            variant: {str(budget): self.curve("distilled", variant, budget) for budget in self.settings.budgets}
            for variant in self.settings.variants
        }

    def delta_cosines(self, variant: str) -> dict[str, Any]:
        """cos(base delta, the variant's own two-phase delta) for each of the base's deltas (App. G)."""
        from kinfolk.plugins.adapt import DeltaCosineConfig, delta_cosine

        steps = self.settings.steps
        own = self.distilled(variant, "two-phase", steps) / "delta"
        result = {}
        for phases in PHASES:
            base = self.distilled(BASE, phases, steps) / "delta"
            cosine = delta_cosine(DeltaCosineConfig(a=str(base), b=str(own)), progress=False)
            result[phases] = {"cosine": cosine["cosine"], "per_layer": [row["cosine"] for row in cosine["per_layer"]]}
        return result

    def transfer(self) -> dict[str, Any]:
        steps = self.settings.steps
        return {
            variant: {
                "curves": {method: self.curve(method, variant, steps) for method in METHODS},
                "delta_cosine": self.delta_cosines(variant),
            }
            for variant in self.settings.variants
        }

    def routing(self, thresholds: Sequence[float] = ROUTING_THRESHOLDS) -> dict[str, Any]:
        """`kinfolk route` over each routed family of the routing variant at `thresholds`: the order with the better
        mean validation accuracy over sizes, every size answering graded reversals of the validation (calibration)
        and test splits."""
        from kinfolk.plugins.adapt.outcomes import route_outcomes

        variant, steps = self.settings.routing_variant, self.settings.steps
        seed, n = self.family.config.seed, self.settings.routing_problems
        problems = {"calibration": graded_problems(n, seed, "validation"), "test": graded_problems(n, seed, "test")}
        result = {}
        for method in ROUTED:
            curve = self.curve(method, variant, steps)
            order = max(self.settings.orders, key=lambda o: np.mean([s["validation"] for s in curve["orders"][o]]))
            directory = self.sizes(method, variant, steps, order)
            rows = []
            for size in curve["orders"][order]:
                name = Path(size["dir"]).name
                for split, rows_of in problems.items():
                    outcomes = self.graded_outcomes(Path(size["dir"]), rows_of, format_of(variant))
                    rows += [
                        {"split": split, "id": f"{split}-{i}", "model": name, **o} for i, o in enumerate(outcomes)
                    ]
            routing_dir = self.work / "routing" / f"{method}-{variant}-{steps}"
            outcomes_file = routing_dir.with_suffix(".outcomes.jsonl")
            with atomic_file(outcomes_file) as handle:
                handle.writelines(json.dumps(row) + "\n" for row in rows)
            routed = route_outcomes(str(outcomes_file), routing_dir, overwrite=True, models_dir=str(directory),
                                    thresholds=list(thresholds),
                                    policies=list(ROUTING_POLICIES))  # fmt: skip
            result[method] = {"order": order, "out": str(routing_dir), **routed}
        return result

    def graded_outcomes(self, path: Path, problems: Dataset, format_index: int) -> list[dict[str, Any]]:
        """Per graded-reversal problem: its level (word length), whether the model's greedy answer is right in the
        variant's format, and the tokens it ran (prompt, answer and EOS, at most `MAX_NEW_TOKENS` generated)."""

        def compute() -> list[dict[str, Any]]:
            from transformers import AutoModelForCausalLM

            model = AutoModelForCausalLM.from_pretrained(path).eval()
            responses = generate_responses(model, self.tokenizer, problems["prompt"])
            skill = ALL_SKILLS[GRADED]
            rows = []
            for prompt, response in zip(problems["prompt"], responses):
                correct = score_responses(skill, [prompt], [response], format_index)["accuracy"]
                generated = min(len(self.tokenizer(response)["input_ids"]) + 1, MAX_NEW_TOKENS)
                tokens = len(self.tokenizer(prompt)["input_ids"]) + generated
                rows.append({"level": skill.level(prompt), "correct": correct, "tokens": tokens, "prompt": prompt})
            return rows

        key = fingerprint(format_index, problems["prompt"])
        return cached_json(path.parent / f"{path.name}.graded-{key}.json", compute)

    def run(self) -> dict[str, Any]:
        from transformers.utils import logging

        record: dict[str, Any] = {}
        logging.disable_progress_bar()  # hundreds of small models are loaded: no bar for each
        try:
            with single_threaded():
                for stage in self.settings.stages:
                    self._say(f"stage {stage}")
                    record[stage] = getattr(self, stage)()
        finally:
            logging.enable_progress_bar()
        return record


def adapt_family(family: Family, work: Path, settings: AdaptSettings, progress: bool = False) -> dict[str, Any]:
    """One family's record: the stages of `settings` (see the module docstring)."""
    return AdaptFamily(family, work, settings, progress).run()
