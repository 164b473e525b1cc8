"""`kinfolk lab experiment adapt`: ADAPT as the paper runs it, over families (`docs/protocol.md`).

The family (`adapt_family_config`) has an 8-layer teacher, so a student of every other layer plus the last
(`{every: 2, last: 1}`: 5 layers, blocks [0, 2), [2, 4), [4, 6), [6, 7), [7, 8)) patches back through k = 0..5, four
intermediate models; its variants are also post-trained on graded reversal (2-6 letters), the routing task. Every
distillation is `kinfolk distil`'s (`kinfolk.plugins.adapt.distillation.distil_student`): init-student, then the two phases of ADAPT §3.2
under one schedule — the family's pre-training text (every token: CE, KL, block cosine) for `pretraining_fraction`
of the steps, then the teacher's own SFT data (response tokens only) — and the delta. Per family, in the order the
issue asks for (`stages`):

1. **interpolation** (first): each variant's student distilled directly from it (ADAPT (distilled)) at every budget
   of `budgets`, patched back both ways (`kinfolk merge patch --all`, both orders); every size is measured —
   accuracy in the variant's format on the retained and target skills' test problems, KL(variant ‖ model) per
   response token, and the cosine to the variant per layer (each layer against the last teacher layer of its block)
   and per position of the final layer (App. D.1). Per size the order with the better validation accuracy is kept
   (the paper picks the better order per model; here on validation problems, not test ones).
2. **transfer** (at `steps`): the base student distilled from the base (two phases) gives the delta; per variant,
   ADAPT (weight-delta) = the variant's init + delta, patched back, against cross-patch (2-phase) = the variant's blocks
   patched into the distilled base student, and ADAPT (distilled) from stage 1; single-phase base deltas (pre-training
   only, SFT only; App. F.1) are the ablation; `delta-cosine` between each base delta and the variant's own delta
   (App. G) is reported beside the transfer's success.
3. **routing** (at `steps`): the graded-reversal problems of the validation split (calibration) and test split
   answered by every size of the routing variant's distilled and weight-delta families; `kinfolk route`
   (`kinfolk.plugins.adapt.outcomes.route_outcomes`, difficulty = word length, cost = parameters × tokens) picks per length the
   smallest size that clears each threshold and measures the frontier on the test split against every fixed size.

Endpoints (`declare_endpoints`, before any run): primary are the interpolation concordances (share of size pairs
whose accuracy, and whose −KL, rise with size: 1 is monotone, 0.5 no trend), the transfer's paired accuracy
differences (weight-delta − cross-patch, weight-delta − distilled, mean over the sizes below the variant) and the
routing gain (routed accuracy at each fixed size's cost minus its accuracy, mean over sizes); the rest is exploratory.

>>> [e.name for e in declare_endpoints(AdaptSettings()) if e.primary][:2]
['interpolation/large_instruct/30 accuracy concordance', 'interpolation/large_instruct/30 KL concordance']
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from datasets import Dataset

from kinfolk.atomic import atomic_file, fingerprint
from kinfolk.lab import corpus
from kinfolk.lab.evaluate import MAX_NEW_TOKENS, generate_responses, score_responses
from kinfolk.lab.family import BRACKET_FORMAT, Family, LabConfig
from kinfolk.lab.plots import plot_families, save_figure
from kinfolk.lab.replication import Endpoint, cached_json, run_families, settings_key
from kinfolk.lab.skills import ALL_SKILLS, GRADED, GRADED_LENGTHS, HELD_OUT, RETAINED, TARGET
from kinfolk.lab.tokenizer import MAX_LENGTH
from kinfolk.lab.training import single_threaded

BASE = "large_base"
SCORED = [RETAINED, TARGET]  # the accuracy of every size: the skills every variant is post-trained on
ORDERS = ("back-to-front", "front-to-back")
PHASES = ("two-phase", "pretraining", "sft")  # what a distillation trains on (F.1's single-phase deltas)
STAGES = ("interpolation", "transfer", "routing")
METHODS = {  # method of the transfer stage -> the student whose layers the variant's blocks are patched back into
    "distilled": "the variant's own two-phase student (ADAPT (distilled))",
    "weight-delta": "the variant's init + the base's two-phase delta (ADAPT (weight-delta))",
    "cross-patch": "the variant's blocks patched into the two-phase base student (cross-patch (2-phase))",
    "pretraining-delta": "the variant's init + the base's pre-training-only delta (F.1)",
    "sft-delta": "the variant's init + the base's SFT-only delta (F.1)",
}
ROUTED = ("distilled", "weight-delta")
TRAINING_SETTINGS = ("layers", "learning_rate", "pretraining_fraction", "batch_size")
MEASURING_SETTINGS = ("eval_problems", "validation_problems", "kl_examples")
ROUTING_POLICIES = ("average", "minimum")
ADAPT_LARGE_SHAPE = {"num_hidden_layers": 8, "hidden_size": 128, "intermediate_size": 512}
ADAPT_SKILL_SHARES = {RETAINED: 0.35, TARGET: 0.3, HELD_OUT: 0.15, GRADED: 0.2}
ADAPT_POST_TRAINED = [RETAINED, TARGET, GRADED]


def adapt_family_config(seed: int, quick: bool = False, **overrides) -> LabConfig:
    """The ADAPT families: the lab's family with an 8-layer teacher whose pre-training and post-training include
    graded reversal (so every model has its own key: none is shared with the default families); `quick` uses the
    quick budgets."""
    values = {
        "seed": seed,
        "large_shape": ADAPT_LARGE_SHAPE,
        "skill_shares": ADAPT_SKILL_SHARES,
        "post_trained_skills": ADAPT_POST_TRAINED,
    } | overrides
    return LabConfig.quick_config(**values) if quick else LabConfig(**values)


@dataclass
class AdaptSettings:
    """What one family's ADAPT runs do; its hash keys the per-family records, so a changed setting reruns (trained
    students and measurements are kept by what determines them and reused)."""

    variants: list[str] = field(
        default_factory=lambda: ["large_instruct", "large_bracket"], metadata={"help": "Post-trained variants."}
    )
    layers: str = field(
        default="{every: 2, last: 1}", metadata={"help": "Teacher layers of the students (YAML layer selection)."}
    )
    orders: list[str] = field(default_factory=lambda: list(ORDERS), metadata={"help": "Patch orders."})
    budgets: list[int] = field(
        # 300 steps already give a student as accurate as its 8-layer teacher (nothing left to interpolate), so the
        # short budgets show the curve while the student still trails
        default_factory=lambda: [30, 100, 300, 1000],
        metadata={"help": "Interpolation stage: steps of each variant's direct two-phase distillation, one run each."},
    )
    steps: int = field(
        default=300,
        metadata={"help": "Steps of every distillation of the transfer and routing stages (in `budgets`: shared)."},
    )
    learning_rate: float = field(default=2e-3, metadata={"help": "Peak learning rate of every distillation."})
    pretraining_fraction: float = field(
        default=0.5, metadata={"help": "Share of the steps on the pre-training phase (ADAPT: 0.5)."}
    )
    batch_size: int = field(default=32, metadata={"help": "Rows per distillation step."})
    eval_problems: int = field(default=200, metadata={"help": "Test problems per scored skill (copy, reverse)."})
    validation_problems: int = field(
        default=200, metadata={"help": "Validation problems per scored skill: choose each size's patch order."}
    )
    kl_examples: int = field(
        default=256, metadata={"help": "Test-split examples in each variant's format for KL and cosine."}
    )
    routing_problems: int = field(
        default=60, metadata={"help": "Graded-reversal problems per length in each routing split (calibration, test)."}
    )
    routing_variant: str = field(default="large_instruct", metadata={"help": "Variant whose families are routed."})
    stages: list[str] = field(default_factory=lambda: list(STAGES), metadata={"help": "Stages to run, in order."})

    def __post_init__(self) -> None:
        from kinfolk.plugins.adapt.distillation import layer_selection

        layer_selection(self.layers)
        unknown = sorted(set(self.stages) - set(STAGES)) + sorted(set(self.orders) - set(ORDERS))
        unknown += sorted(set(self.variants) - {"large_instruct", "large_bracket"})
        if unknown:
            raise ValueError(
                f"unknown stages, orders or variants {unknown}: {STAGES}, {ORDERS}, large_instruct/bracket"
            )
        if "routing" in self.stages and self.routing_variant not in self.variants:
            raise ValueError(f"routing_variant {self.routing_variant!r} is not among the variants {self.variants}")


def format_of(variant: str) -> int:
    """The answer format a teacher is post-trained in (the base's SFT phase uses the preferred one)."""
    return BRACKET_FORMAT if variant == "large_bracket" else 0


def graded_problems(per_level: int, seed: int, split: str) -> Dataset:
    """`per_level` graded-reversal problems of each length (the first drawn of each), with their level."""
    skill = ALL_SKILLS[GRADED]
    lengths = range(GRADED_LENGTHS[0], GRADED_LENGTHS[1] + 1)
    drawn = corpus.eval_problems(GRADED, 4 * per_level * len(lengths), seed, split)
    kept = {length: [] for length in lengths}
    for row in drawn:
        rows = kept[skill.level(row["prompt"])]
        if len(rows) < per_level:
            rows.append(row)
    return Dataset.from_list([row for length in lengths for row in kept[length]])


def concordance(values: list[float]) -> float:
    """Share of pairs i < j (sizes in order) with values[j] > values[i], ties counting one half: (1 + Kendall's
    τ_a) / 2; 1 for a strictly rising curve, 0.5 for a flat one, 0 for a falling one.

    >>> concordance([0.1, 0.3, 0.2, 0.9]), concordance([0.5, 0.5, 0.5])
    (0.8333333333333334, 0.5)
    """
    pairs = [(a, b) for i, a in enumerate(values) for b in values[i + 1 :]]
    return float(np.mean([1.0 if b > a else 0.5 if b == a else 0.0 for a, b in pairs]))


def largest_drop(values: list[float]) -> float:
    """The largest fall from one size to the next (0 when the curve never falls)."""
    return float(max([0.0, *(a - b for a, b in itertools.pairwise(values))]))


# ------------------------------------------------------------------------------------------------ measurement
@torch.no_grad()
def teacher_agreement(model, teacher, batches: list[dict[str, torch.Tensor]], aligned: list[int]) -> dict[str, Any]:
    """KL(teacher ‖ model) per response token (positions whose next label is trained), and the cosine of the
    model's hidden states to the teacher's: per model layer against teacher layer `aligned[j]` (the last of its
    block) over every real position, and of the final layer (after the final norm) per position index, with its
    means over prompt and response positions."""
    from kinfolk.trainers.layer_distillation_trainer import LayerOutputs

    model_outputs = LayerOutputs(model, list(range(len(aligned))))
    teacher_outputs = LayerOutputs(teacher, sorted(set(aligned)))
    try:
        return _agreement(model, teacher, batches, aligned, model_outputs, teacher_outputs)
    finally:
        model_outputs.remove()
        teacher_outputs.remove()


def _agreement(model, teacher, batches, aligned, model_outputs, teacher_outputs) -> dict[str, Any]:
    kl_sum, kl_count = 0.0, 0
    layer_sums = np.zeros(len(aligned))
    position_sums, position_counts = np.zeros(MAX_LENGTH), np.zeros(MAX_LENGTH)
    part_sums, part_counts = {"prompt": 0.0, "response": 0.0}, {"prompt": 0, "response": 0}
    real_count = 0
    for batch in batches:
        inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
        with model_outputs.record() as ours:
            logits = model(**inputs).logits.float()
        with teacher_outputs.record() as theirs:
            teacher_logits = teacher(**inputs).logits.float()
        real = batch["attention_mask"].bool()
        real_count += int(real.sum())
        for j, layer in enumerate(aligned):
            layer_sums[j] += float(
                F.cosine_similarity(ours[j][real].float(), theirs[layer][real].float(), dim=-1).sum()
            )
        final = F.cosine_similarity(ours["final"].float(), theirs["final"].float(), dim=-1)  # (batch, length)
        width = final.shape[1]
        position_sums[:width] += (final * real).sum(0).numpy()
        position_counts[:width] += real.sum(0).numpy()
        response = torch.zeros_like(real)
        response[:, 1:] = batch["labels"][:, 1:] != -100  # the tokens the variant was trained to answer
        for part, mask in (("response", response & real), ("prompt", ~response & real)):
            part_sums[part] += float(final[mask].sum())
            part_counts[part] += int(mask.sum())
        scored = batch["labels"][:, 1:] != -100  # position t predicts label t + 1
        teacher_log = teacher_logits[:, :-1][scored].log_softmax(-1)
        kl_sum += float((teacher_log.exp() * (teacher_log - logits[:, :-1][scored].log_softmax(-1))).sum())
        kl_count += int(scored.sum())
    used = position_counts > 0
    return {
        "kl": kl_sum / kl_count,
        "cosine_per_layer": (layer_sums / real_count).tolist(),
        "cosine_per_position": (position_sums[used] / position_counts[used]).tolist(),
        "cosine_final": {part: part_sums[part] / max(part_counts[part], 1) for part in part_sums},
    }


class AdaptFamily:
    """One family's ADAPT runs under `work`: distillations, patched sizes and measurements, each kept on disk by
    what determines it, so a stopped family resumes and a rerun with other settings reuses what it can."""

    def __init__(self, family: Family, work: Path, settings: AdaptSettings, progress: bool = False):
        self.family, self.settings, self.progress = family, settings, progress
        self.tokenizer = family.tokenizer()
        self._contexts: dict[str, dict[str, Any]] = {}
        # Models live under a key of what trains them, measurements carry a key of what measures them.
        trained_by = {name: getattr(settings, name) for name in TRAINING_SETTINGS}
        self.work = Path(work) / f"trained-{settings_key(trained_by)}"
        self.measured_by = settings_key({name: getattr(settings, name) for name in MEASURING_SETTINGS})

    def _say(self, message: str) -> None:
        if self.progress:
            print(f"[kinfolk lab experiment adapt] family {self.family.config.seed}: {message}", flush=True)

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
        sft = self.family.instruct_data(rows * sft_steps, format_of(teacher)) if sft_steps else None
        return text, sft

    def distilled(self, teacher: str, phases: str, steps: int) -> Path:
        """`kinfolk distil` of `teacher`'s student (`phases`, `steps`): its directory (init-student, distilled, delta)."""
        from kinfolk.plugins.adapt.distillation import distil_student
        from kinfolk.trainers import LayerDistillationConfig

        out = self.work / "distil" / f"{teacher}-{phases}-{steps}"
        if (out / "delta" / "adapt_delta.json").exists():  # written last
            return out
        self._say(f"distilling {teacher}'s student ({phases}, {steps} steps)")
        text, sft = self.training_data(teacher, phases, steps)
        config = LayerDistillationConfig(
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
            seed=self.family.config.seed,
            data_seed=self.family.config.seed,
            logging_steps=max(1, steps // 10),
            disable_tqdm=True,
            gradient_checkpointing=False,
        )
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

        if method == "distilled":
            return self.distilled(variant, "two-phase", steps) / "distilled"
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
            examples = corpus.ideal_dataset(SCORED, self.settings.kl_examples, seed + 6, format_of(variant), "test")
            self._contexts[variant] = {
                "teacher": AutoModelForCausalLM.from_pretrained(self.teacher_dir(variant)).eval(),
                "format": format_of(variant),
                "batches": retained_batches(examples, self.tokenizer, max_length=MAX_LENGTH, batch_size=64),
                "problems": {
                    split: {skill: corpus.eval_problems(skill, n, seed, split) for skill in SCORED}
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
                per_skill["mean"] = float(np.mean([per_skill[skill] for skill in SCORED]))
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

    def routing(self) -> dict[str, Any]:
        """`kinfolk route` over each routed family of the routing variant: the order with the better mean validation
        accuracy over sizes, every size answering graded reversals of the validation (calibration) and test splits."""
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
                                    thresholds=[round(t, 2) for t in np.linspace(0, 1, 51)],
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


# ------------------------------------------------------------------------------------------------ endpoints
def _curve_value(variant: str, budget: int, key: str):
    return lambda record: [record["interpolation"][variant][str(budget)][key]]


def _size_gap(variant: str, method: str, baseline: str, metric: str, k: int | None = None):
    """method − baseline on `metric`, at size k or averaged over the sizes below the variant (k < M)."""

    def value(record: dict[str, Any]) -> list[float]:
        curves = record["transfer"][variant]["curves"]
        ours, theirs = curves[method]["chosen"], curves[baseline]["chosen"]
        read = (lambda s: s["test"]["mean"]) if metric == "accuracy" else (lambda s: s["kl"])
        gaps = [read(a) - read(b) for a, b in zip(ours, theirs)]
        return [gaps[k]] if k is not None else [float(np.mean(gaps[:-1]))]

    return value


def _routing_value(method: str, policy: str, key: str):
    def value(record: dict[str, Any]) -> list[float]:
        verdicts = record["routing"][method]["dominance"][policy].values()
        if key == "dominated":
            return [float(np.mean([v["dominated"] for v in verdicts]))]
        return [float(np.mean([v["gain_at_cost"] for v in verdicts]))]

    return value


def _interpolation_endpoints(settings: AdaptSettings) -> tuple[list[Endpoint], list[Endpoint]]:
    primary, exploratory = [], []
    for variant in settings.variants:
        for budget in settings.budgets:
            for key, what in (("accuracy", "accuracy"), ("KL", "−KL(variant ‖ model)")):
                primary.append(Endpoint(
                    f"interpolation/{variant}/{budget} {key} concordance",
                    f"{variant}'s directly two-phase-distilled family ({budget} steps): share of size pairs whose "
                    f"{what} rises with size (1 monotone, 0.5 no trend), sizes k = 0..M, each in its "
                    "validation-chosen patch order",
                    _curve_value(variant, budget, f"{key.lower()}_concordance"), primary=True,
                ))  # fmt: skip
            exploratory.append(Endpoint(
                f"interpolation/{variant}/{budget} largest accuracy drop",
                "largest fall in test accuracy from one size to the next (0: never falls)",
                _curve_value(variant, budget, "largest_accuracy_drop"),
            ))  # fmt: skip
            exploratory.append(Endpoint(
                f"interpolation/{variant}/{budget} student gap",
                "test accuracy of the variant (k = M) minus its distilled student's (k = 0): what there is to "
                "interpolate (0: the student already matches it, and every concordance is about ties)",
                _curve_value(variant, budget, "student_gap"),
            ))  # fmt: skip
    return primary, exploratory


def _transfer_endpoints(settings: AdaptSettings) -> tuple[list[Endpoint], list[Endpoint]]:
    primary, exploratory = [], []
    for variant in settings.variants:
        for baseline in ("cross-patch", "distilled"):
            primary.append(Endpoint(
                f"transfer/{variant}/weight-delta - {baseline}",
                f"{variant}: test accuracy of ADAPT (weight-delta) minus {METHODS[baseline]}, mean over the sizes "
                f"below the variant ({settings.steps} steps)",
                _size_gap(variant, "weight-delta", baseline, "accuracy"), baseline=baseline, primary=True,
            ))  # fmt: skip
        for method in ("pretraining-delta", "sft-delta"):
            exploratory.append(Endpoint(
                f"transfer/{variant}/{method} - weight-delta",
                f"{variant}: test accuracy of {METHODS[method]} minus ADAPT (weight-delta), mean over the sizes "
                "below the variant (F.1)",
                _size_gap(variant, method, "weight-delta", "accuracy"), baseline="weight-delta",
            ))  # fmt: skip
        for method, baseline in (("weight-delta", "cross-patch"), ("weight-delta", "distilled"),
                                 ("pretraining-delta", "weight-delta"), ("sft-delta", "weight-delta")):  # fmt: skip
            exploratory.append(Endpoint(
                f"transfer/{variant}/{method} - {baseline} KL",
                f"{variant}: KL(variant ‖ model) of {method} minus {baseline}, mean over the sizes below the variant",
                _size_gap(variant, method, baseline, "kl"), baseline=baseline, higher_is_better=False,
            ))  # fmt: skip
        for phases in PHASES:
            exploratory.append(Endpoint(
                f"delta-cosine/{variant}/{phases}",
                f"cosine between the base's {phases} delta and {variant}'s own two-phase delta (App. G)",
                lambda record, v=variant, p=phases: [record["transfer"][v]["delta_cosine"][p]["cosine"]],
            ))  # fmt: skip
    return primary, exploratory


def _routing_endpoints(settings: AdaptSettings) -> tuple[list[Endpoint], list[Endpoint]]:
    primary, exploratory = [], []
    for method in ROUTED:
        for policy in ROUTING_POLICIES:
            metric = "accuracy" if policy == "average" else "minimum accuracy over lengths"
            primary.append(Endpoint(
                f"routing/{method}/{policy} gain at equal cost",
                f"{settings.routing_variant}'s {method} family, graded reversal: best routed ({policy} policy) "
                f"{metric} at no more cost than each fixed size, minus that size's, mean over the sizes",
                _routing_value(method, policy, "gain"), baseline="fixed size", primary=True,
            ))  # fmt: skip
            exploratory.append(Endpoint(
                f"routing/{method}/{policy} share of fixed sizes beaten",
                "share of fixed sizes with a routed point at most as costly and at least as accurate (one strictly)",
                _routing_value(method, policy, "dominated"),
            ))  # fmt: skip
    return primary, exploratory


STAGE_ENDPOINTS = {
    "interpolation": _interpolation_endpoints,
    "transfer": _transfer_endpoints,
    "routing": _routing_endpoints,
}


def declare_endpoints(settings: AdaptSettings) -> list[Endpoint]:
    """The stages' primary endpoints first (interpolation concordances, the transfer's accuracy gaps against
    cross-patch and direct distillation, the routing gains), then the exploratory ones."""
    declared = [STAGE_ENDPOINTS[stage](settings) for stage in STAGES if stage in settings.stages]
    return [e for primary, _ in declared for e in primary] + [e for _, exploratory in declared for e in exploratory]


# ------------------------------------------------------------------------------------------------ curves and plot
_CURVE_READS = {"layers": lambda s: s["layers"], "accuracy": lambda s: s["test"]["mean"], "kl": lambda s: s["kl"]}


def curves_summary(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Every family's curves (test accuracy and KL to the variant per size k, the sizes' layer counts): per variant,
    the interpolation stage's per budget and the transfer stage's per method, for the plot."""

    def curve(entry: dict[str, Any]) -> dict[str, list[float]]:
        sizes = entry["chosen"]
        return {key: [read(size) for size in sizes] for key, read in _CURVE_READS.items()}

    curves: dict[str, Any] = {"interpolation": {}, "transfer": {}}
    for record in records:
        family = str(record["family_seed"])
        for variant, budgets in record.get("interpolation", {}).items():
            for budget, entry in budgets.items():
                curves["interpolation"].setdefault(variant, {}).setdefault(budget, {})[family] = curve(entry)
        for variant, stage in record.get("transfer", {}).items():
            for method, entry in stage["curves"].items():
                curves["transfer"].setdefault(variant, {}).setdefault(method, {})[family] = curve(entry)
    return {"curves": curves}


def plot_curves(results: dict[str, Any], path: str | Path) -> Path:
    """Test accuracy and KL(variant ‖ model) (log axis) against the size k, one row per variant and stage
    (interpolation: a line per budget; transfer: a line per method): each family a thin line, the mean over
    families (geometric for KL) a thick one."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(stage, variant, lines) for stage in ("interpolation", "transfer")
              for variant, lines in results["curves"][stage].items()]  # fmt: skip
    figure, axes = plt.subplots(len(panels), 2, figsize=(11, 3.4 * len(panels)), squeeze=False)
    palette = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for row, (stage, variant, lines) in enumerate(panels):
        for column, measure in enumerate(("accuracy", "kl")):
            axis = axes[row][column]
            for colour, (line, families) in zip(palette, lines.items()):
                values = np.asarray([family[measure] for family in families.values()], dtype=float)
                if measure == "kl":  # k = M is the variant itself: KL 0, nothing to draw on a log axis
                    values = np.clip(values[:, :-1], 1e-6, None)
                label = f"{line} steps" if stage == "interpolation" else line
                sizes = np.arange(values.shape[1])
                plot_families(axis, sizes, values, colour, label, geometric=measure == "kl", marker="o", markersize=3)
                axis.set_xticks(sizes)
            if measure == "kl":
                axis.set_yscale("log")
            axis.set_xlabel("size k (blocks patched back: 0 the student ... M the variant)")
            axis.set_ylabel("test accuracy" if measure == "accuracy" else "KL(variant ‖ model), k < M")
            axis.set_title(f"{stage}: {variant} ({len(next(iter(lines.values())))} families)")
            axis.legend(fontsize=7)
    return save_figure(figure, path)


def run_adapt(
    out: str | Path,
    families: list[int],
    settings: AdaptSettings | None = None,
    quick: bool = False,
    family_overrides: dict[str, Any] | None = None,
    **options,
) -> dict[str, Any]:
    """The experiment over `families` (family seeds; `family_overrides` go to `adapt_family_config`); `options` go
    to `replication.run_families`. Writes `results.json` (with every family's curves) and `curves.png` to `out`."""
    settings = settings or AdaptSettings()
    results = run_families(
        "adapt",
        out,
        families,
        lambda seed: adapt_family_config(seed, quick, **(family_overrides or {})),
        lambda family, work: adapt_family(family, work, settings, progress=options.get("progress", True)),
        declare_endpoints(settings),
        {**dataclasses.asdict(settings), "quick": quick, "family_overrides": family_overrides or {}},
        summary=curves_summary,
        **options,
    )
    if results["curves"]["interpolation"] or results["curves"]["transfer"]:
        plot_curves(results, Path(out) / "curves.png")
    return results


if __name__ == "__main__":  # python -m kinfolk.lab.adapt_experiment RESULTS.json FIGURE.png
    import sys

    plot_curves(json.loads(Path(sys.argv[1]).read_text()), sys.argv[2])
