"""`kinfolk lab experiment atlas`: ATLAS against its comparators as drift-versus-gain Pareto fronts, over families.

The question: at equal gain on a target skill, does an ATLAS adapter move the model's retained behaviour less than
LoRA and LoRA's regularised variants, and is that more than taking smaller steps? Each family is one draw of the
world (`replication.run_families`); inside it, every method learns each target skill from the frozen large base:

- methods (`METHODS`): `lora`; `corda` (CorDA-KPM from the retained data); the ATLAS residuals `plain`, `centered`,
  `atlas` (full); `norm-matched` (the plain residual rescaled per token to the full residual's norm: the control that
  asks whether the filters matter beyond step size); `lora+replay` and `lora+output-kl` (`WeightedSFTTrainer`'s
  regularisers). All at one placement and rank: the attention output projection of the layer at mid depth (the
  paper's 17/36) of an 8-layer large base, rank 4 of width 128;
- target skills: `reverse` (reversal of letters, whose inputs overlap the retained skill's: copying letters) and
  `flip` (reversal of digits with its own prompt word: inputs far from the retained ones). The families' bases learn
  both in pre-training in every answer format (`FAMILY_SHARES`); what an adapter learns is to answer in the
  preferred one, so the frozen model starts well below the ceiling and every method can reach it;
- a shared learning-rate grid (`learning_rates`) for every method, and for Replay / Output-KL each strength
  (`replay_ratios`, `output_kl_coefs`) at each of a sparser grid of rates (`regularised_learning_rates`): one run
  per (method, rate, strength), measured every `checkpoint_every` steps, so each run traces a curve and no run is
  spent per target level.

Measured at every checkpoint, on validation and on test problems of the family's own seed: the target score
(correct answer in the preferred format), retained KL (KL(frozen ‖ current) on teacher-forced retained contexts,
against the original base, so CorDA's rewritten weight is no excuse), retained answer churn against the frozen model's
answers (F: correct → wrong answer content), and the effective update size (mean per-token norm of what the adapted
module adds to the original module's output) on target and on retained tokens. Retained contexts and churn problems
come from the validation and test splits, disjoint from each other and from the train-split rows that fit the atlas
and feed Replay and Output-KL.

Fronts (`analyse_target`). A method's front is, for each target level k, the lowest retained KL among its checkpoints
scoring at least k (likewise for F). Its runs are chosen on validation: the (rate, strength) configurations that attain
the method's validation front somewhere in the comparison range, plus the one that reaches its highest validation
score. The reported fronts use only those configurations' test measurements. Levels are fractions of LoRA's gain on
test: 0 is the frozen score, 1 LoRA's best test score (its plateau); the comparison range is `AREA_RANGE` of that gain,
the fixed levels `GAIN_LEVELS` (mid, near the plateau). A family where LoRA gains less than `MIN_GAIN` has no levels.

Primary endpoints (`declare_endpoints`), per target and method, paired with LoRA in the same family: the mean over the
range of ln(KL_method / KL_LoRA) between the two fronts (the area between them on a log-KL axis, per unit of target
score), and ln(KL_method / KL_LoRA) at the mid and near-plateau levels; and the same three for full ATLAS against the
norm-matched control. Negative favours the method; exp(mean) is the geometric-mean KL ratio. A method whose front
never reaches a level has no value in that family (it is counted, and the endpoint then has no interval): that it does
not reach it is the result. Exploratory: F at the levels, each method's reach, the update norms at the mid level and
the target tokens' distance from the retained atlas (`geometry`).

>>> front([(0.2, 0.5), (0.4, 0.3), (0.6, 0.9)], 0.3)  # lowest measure among points scoring >= 0.3
0.3
>>> front([(0.2, 0.5)], 0.3) is None  # never reached
True
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import math
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from datasets import Dataset

from kinfolk.lab import corpus
from kinfolk.lab.family import Family, LabConfig
from kinfolk.lab.plots import plot_families, save_figure
from kinfolk.lab.replication import Endpoint, cached_json, run_families, settings_key
from kinfolk.lab.skills import HELD_OUT, RETAINED, SEPARATED_TARGET, SKILLS, TARGET, answer_of, render
from kinfolk.lab.tokenizer import MAX_LENGTH
from kinfolk.lab.training import lab_trainer, save_model, single_threaded

BASELINE = "lora"
CONTROL = "norm-matched"  # full ATLAS's step-size control
RESIDUALS = {"plain": "plain", "centered": "centered", "atlas": "atlas", CONTROL: "norm_matched"}
REGULARISERS = {"lora+replay": "replay_ratio", "lora+output-kl": "output_kl_coef"}  # WeightedSFTConfig fields
METHODS = ("lora", "corda", "plain", "centered", "atlas", CONTROL, "lora+replay", "lora+output-kl")
TARGETS = (TARGET, SEPARATED_TARGET)
SPLITS = ("validation", "test")
# The experiment's families: an 8-layer large base that learns both target skills in pre-training (every format).
FAMILY_SHARES = {RETAINED: 0.35, TARGET: 0.35, HELD_OUT: 0.1, SEPARATED_TARGET: 0.2}
GAIN_LEVELS = {"mid": 0.5, "plateau": 0.9}  # fixed target levels, as fractions of LoRA's test gain
AREA_RANGE = (0.1, 0.9)  # the comparison range, as fractions of LoRA's test gain
MIN_GAIN = 0.05  # below this LoRA gain (target score) a family has no levels
PLOT_GRID = tuple(round(0.05 * i, 2) for i in range(1, 25))  # fractions of LoRA's gain where fronts are tabulated


@dataclass
class AtlasSettings:
    """What one family's ATLAS runs do; its hash keys the per-family records, so a changed setting reruns."""

    targets: list[str] = field(
        default_factory=lambda: list(TARGETS), metadata={"help": "Target skills (reverse: overlapping, flip: apart)."}
    )
    methods: list[str] = field(default_factory=lambda: list(METHODS), metadata={"help": "Methods (lora first)."})
    # A first family at 3e-3..1e-1 and 200 steps: every method reached the plateau by step 50 and LoRA's front came
    # from the lowest rate, so the grid reaches lower and the runs are shorter with denser checkpoints.
    learning_rates: list[float] = field(
        default_factory=lambda: [1e-3, 3e-3, 1e-2, 3e-2], metadata={"help": "Learning-rate grid of every method."}
    )
    regularised_learning_rates: list[float] = field(
        default_factory=lambda: [3e-3, 3e-2],
        metadata={"help": "Learning rates of Replay and Output-KL (each at every strength): a sparser grid."},
    )
    replay_ratios: list[float] = field(
        default_factory=lambda: [0.1, 0.25, 0.5], metadata={"help": "Replay's shares of retained examples."}
    )
    output_kl_coefs: list[float] = field(
        default_factory=lambda: [0.3, 1.0, 3.0], metadata={"help": "Output-KL's strengths λ."}
    )
    steps: int = field(default=100, metadata={"help": "Optimiser steps of every run (cosine schedule)."})
    batch_size: int = field(default=16, metadata={"help": "Target examples per optimiser step."})
    checkpoint_every: int = field(default=10, metadata={"help": "Steps between measured checkpoints."})
    rank: int = field(default=4, metadata={"help": "Adapter rank (the width is 128)."})
    layer: int | None = field(
        default=None, metadata={"help": "Adapted decoder layer (default: mid depth, the paper's 17/36)."}
    )
    module: str = field(default="self_attn.o_proj", metadata={"help": "Adapted linear module of that layer."})
    regions: int = field(default=8, metadata={"help": "Atlas regions (k-means clusters)."})
    large_layers: int = field(default=8, metadata={"help": "Decoder layers of the families' large base."})
    target_examples: int = field(default=1024, metadata={"help": "Target training examples (train split)."})
    fit_examples: int = field(
        default=512, metadata={"help": "Retained train-split rows that fit the atlas and CorDA and feed Replay/KL."}
    )
    kl_contexts: int = field(default=128, metadata={"help": "Retained-KL contexts per split (validation, test)."})
    validation_problems: int = field(default=50, metadata={"help": "Validation problems per skill."})
    eval_problems: int = field(default=100, metadata={"help": "Test problems per skill."})

    def __post_init__(self) -> None:
        unknown = sorted(set(self.methods) - set(METHODS)) + sorted(set(self.targets) - set(SKILLS))
        if unknown:
            raise ValueError(f"unknown methods or skills {unknown}: methods {list(METHODS)}, skills {list(SKILLS)}")
        if BASELINE not in self.methods:
            raise ValueError(f"the methods must include the baseline {BASELINE!r}: every endpoint is paired with it")
        if RETAINED in self.targets:
            raise ValueError(f"{RETAINED!r} is the retained skill, not a target")

    def rates(self, method: str) -> list[float]:
        """The learning rates `method` runs at (Replay and Output-KL: the sparser grid)."""
        return list(self.regularised_learning_rates if method in REGULARISERS else self.learning_rates)

    def strengths(self, method: str) -> list[float | None]:
        option = REGULARISERS.get(method)
        return list(getattr(self, f"{option}s")) if option else [None]


def family_config(seed: int, settings: AtlasSettings, quick: bool = False) -> LabConfig:
    """The experiment's family: the lab's config with an 8-layer large base that also pre-trains on `flip` (and
    must answer it, in any format, as it must reversal)."""
    base = LabConfig.quick_config(seed=seed) if quick else LabConfig(seed=seed)
    thresholds = dict(base.thresholds)
    if not quick:
        thresholds["large_base"] = {**thresholds["large_base"], SEPARATED_TARGET: ("answer_accuracy", 0.8)}
    return dataclasses.replace(
        base,
        large_shape={**base.large_shape, "num_hidden_layers": settings.large_layers},
        skill_shares=dict(FAMILY_SHARES),
        thresholds=thresholds,
    )


# ------------------------------------------------------------------------------------------------ measurement
@dataclass
class Context:
    """What every run of one family is measured on, built once from the frozen large base."""

    family: Family
    settings: AtlasSettings
    tokenizer: Any
    layer: int
    fit_data: Dataset  # train split: atlas fit, CorDA, Replay, Output-KL
    problems: dict[str, dict[str, Dataset]]  # split -> skill -> problems
    frozen_answers: dict[str, dict[str, list[str]]]  # split -> skill -> the frozen model's greedy responses
    kl: dict[str, tuple[list[dict], Any]]  # split -> (retained contexts' batches, the frozen model's cache)
    target_texts: dict[str, list[dict]]  # target -> batches of its test problems with answers (update norms)
    original: tuple[torch.Tensor, torch.Tensor | None]  # the adapted module's frozen weight and bias
    atlas: dict[str, torch.Tensor]  # the fitted atlas's buffers

    @property
    def seed(self) -> int:
        return self.family.config.seed

    def frozen_score(self, skill: str, split: str) -> float:
        return accuracy(self.problems[split][skill], self.frozen_answers[split][skill])

    def atlas_config(self, residual: str = "atlas"):
        from kinfolk.plugins.atlas import AtlasConfig

        s = self.settings
        return AtlasConfig(
            r=s.rank,
            residual=residual,
            num_regions=s.regions,
            layers_to_transform=[self.layer],
            target_modules=[s.module],
        )


def accuracy(problems: Dataset, responses: list[str]) -> float:
    """Share of responses that are the correct answer in the preferred format."""
    return float(np.mean([r == render(a) for r, a in zip(responses, problems["answer"])]))


def churn(problems: Dataset, frozen: list[str], current: list[str]) -> dict[str, int]:
    """Answer content against the frozen model's (`kinfolk.callbacks.churn`): C changed, F correct → wrong,
    G wrong → correct, W wrong → other wrong; `correct` = the frozen model's correct answers (F's opportunities)."""
    from kinfolk.callbacks.churn import Outcome, churn_counts

    def outcomes(responses: list[str]) -> dict[int, Outcome]:
        return {
            i: Outcome(answer_of(r), answer_of(r) == answer)
            for i, (r, answer) in enumerate(zip(responses, problems["answer"]))
        }

    before = outcomes(frozen)
    counts = churn_counts(before, outcomes(current))
    return {kind: int(counts[kind]) for kind in ("C", "F", "G", "W")} | {
        "correct": sum(o.correct for o in before.values())
    }


def _text_batches(problems: Dataset, tokenizer, positions: str) -> list[dict]:
    from kinfolk.batches import retained_batches

    rows = Dataset.from_dict({"prompt": problems["prompt"], "completion": [render(a) for a in problems["answer"]]})
    return retained_batches(rows, tokenizer, positions, MAX_LENGTH, batch_size=64)


def adapted_module_name(model: torch.nn.Module, layer: int, module: str) -> str:
    """The one module name of `model` that is decoder layer `layer`'s `module`."""
    suffix = f"layers.{layer}.{module}"
    names = [name for name, _ in model.named_modules() if name.endswith(suffix)]
    if len(names) != 1:
        raise ValueError(f"expected one module ending in {suffix!r}, found {names}")
    return names[0]


@contextlib.contextmanager
def _module_io(module: torch.nn.Module) -> Iterator[list[tuple[torch.Tensor, torch.Tensor]]]:
    """(input, output) of every forward of `module` inside the block."""
    seen: list[tuple[torch.Tensor, torch.Tensor]] = []
    handle = module.register_forward_hook(lambda _, args, output: seen.append((args[0].detach(), output.detach())))
    try:
        yield seen
    finally:
        handle.remove()


def prepare(family: Family, settings: AtlasSettings) -> Context:
    """Problems, the frozen model's answers and KL caches, and the atlas fitted on the retained train rows."""
    from peft import get_peft_model

    from kinfolk.divergence import FrozenCache
    from kinfolk.lab.evaluate import generate_responses
    from kinfolk.plugins.atlas import fit_atlas
    from kinfolk.plugins.atlas.layer import ATLAS_BUFFERS
    from kinfolk.plugins.atlas.model import default_layer

    tokenizer = family.tokenizer()
    frozen = family.load("large_base").eval()
    layer = settings.layer if settings.layer is not None else default_layer(frozen.config.num_hidden_layers)
    seed = family.config.seed
    sizes = {"validation": settings.validation_problems, "test": settings.eval_problems}
    skills = [RETAINED, *settings.targets]
    problems = {
        split: {skill: corpus.eval_problems(skill, n, seed, split) for skill in skills} for split, n in sizes.items()
    }
    prompts = [p for split in SPLITS for skill in skills for p in problems[split][skill]["prompt"]]
    responses = iter(generate_responses(frozen, tokenizer, prompts))
    answers = {split: {skill: [next(responses) for _ in range(sizes[split])] for skill in skills} for split in SPLITS}
    kl = {}
    for split in SPLITS:
        contexts = corpus.eval_problems(RETAINED, settings.kl_contexts, seed, split)  # the split's first problems
        batches = _text_batches(contexts, tokenizer, "response")
        kl[split] = (batches, FrozenCache.build(frozen, batches))
    module = frozen.get_submodule(adapted_module_name(frozen, layer, settings.module))
    original = (module.weight.detach().clone(), None if module.bias is None else module.bias.detach().clone())
    context = Context(
        family=family,
        settings=settings,
        tokenizer=tokenizer,
        layer=layer,
        fit_data=family.retained(settings.fit_examples),
        problems=problems,
        frozen_answers=answers,
        kl=kl,
        target_texts={t: _text_batches(problems["test"][t], tokenizer, "all") for t in settings.targets},
        original=original,
        atlas={},
    )
    template = get_peft_model(family.load("large_base"), context.atlas_config())
    fit_atlas(template, context.fit_data, tokenizer=tokenizer, max_length=MAX_LENGTH, seed=seed, progress=False)
    atlas_layer = _tuner_layer(template)
    context.atlas = {name[6:]: getattr(atlas_layer, name)["default"].detach().clone() for name in ATLAS_BUFFERS}
    return context


def _tuner_layer(model: torch.nn.Module) -> torch.nn.Module:
    from peft.tuners.tuners_utils import BaseTunerLayer

    layers = [module for module in model.modules() if isinstance(module, BaseTunerLayer)]
    if len(layers) != 1:
        raise ValueError(f"expected one adapted module, found {len(layers)}")
    return layers[0]


@torch.no_grad()
def geometry(context: Context) -> dict[str, dict[str, float]]:
    """How far each target's test tokens lie from the retained atlas, against held-out retained tokens: mean
    squared distance to the routed centre (in units of s_d, about 1 on the fitting tokens), mean ρ(h), and the share
    of target tokens farther than 95 % of the retained ones; inputs of the adapted module in the frozen model."""
    from peft import get_peft_model

    model = get_peft_model(context.family.load("large_base"), context.atlas_config()).eval()
    layer = _tuner_layer(model)
    layer.set_atlas("default", **context.atlas)

    def tokens(batches: list[dict]) -> dict[str, torch.Tensor]:
        inputs = []
        with model.disable_adapter(), _module_io(layer) as seen:
            for batch in batches:
                seen.clear()
                model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
                inputs.append(seen[0][0][batch["attention_mask"].bool()])
        return layer.token_geometry(torch.cat(inputs), "default")

    retained = tokens(context.kl["test"][0])
    threshold = torch.quantile(retained["distance"], 0.95)
    result = {}
    for target in context.settings.targets:
        ours = tokens(context.target_texts[target])
        result[target] = {
            "target_distance": float(ours["distance"].mean()),
            "retained_distance": float(retained["distance"].mean()),
            "target_rho": float(ours["rho"].mean()),
            "retained_rho": float(retained["rho"].mean()),
            "target_beyond_retained_p95": float((ours["distance"] > threshold).float().mean()),
        }
    return result


@torch.no_grad()
def measure(context: Context, target: str, model: torch.nn.Module, step: int) -> dict[str, Any]:
    """One checkpoint: per split the target score, retained KL and churn; on test, the update norms."""
    from kinfolk.divergence import last_hidden_states, token_divergence
    from kinfolk.lab.evaluate import generate_responses

    was_training = model.training
    model.eval()
    skills = [target, RETAINED]
    prompts = [p for split in SPLITS for skill in skills for p in context.problems[split][skill]["prompt"]]
    responses = iter(generate_responses(model, context.tokenizer, prompts))
    point: dict[str, Any] = {"step": step}
    module = _tuner_layer(model)
    weight, bias = context.original

    def update_norms(seen, batch) -> torch.Tensor:
        inputs, outputs = seen[-1]
        update = outputs - torch.nn.functional.linear(inputs, weight, bias)
        return update.norm(dim=-1)[batch["attention_mask"].bool()]

    retained_norms: list[torch.Tensor] = []
    for split in SPLITS:
        got = {skill: [next(responses) for _ in context.problems[split][skill]["prompt"]] for skill in skills}
        divergence, tokens = 0.0, 0
        batches, frozen = context.kl[split]
        with _module_io(module) as seen:
            for batch in batches:
                result = token_divergence(
                    model, batch["input_ids"], batch["attention_mask"], batch["labels"], frozen=frozen
                )
                divergence += float(result.values[result.mask].double().sum())
                tokens += int(result.mask.sum())
                if split == "test":
                    retained_norms.append(update_norms(seen, batch))
        point[split] = {
            "target": accuracy(context.problems[split][target], got[target]),
            "kl": divergence / max(tokens, 1),
            **churn(context.problems[split][RETAINED], context.frozen_answers[split][RETAINED], got[RETAINED]),
        }
    target_norms = []
    with _module_io(module) as seen:
        for batch in context.target_texts[target]:
            # the backbone itself, as token_divergence runs it: in the weights' dtype, outside the trainer's autocast
            last_hidden_states(model, batch["input_ids"], batch["attention_mask"])
            target_norms.append(update_norms(seen, batch))
    point["norm_target"] = float(torch.cat(target_norms).mean())
    point["norm_retained"] = float(torch.cat(retained_norms).mean())
    model.train(was_training)
    return point


# ------------------------------------------------------------------------------------------------ training
def build_adapter(context: Context, method: str, seed: int) -> torch.nn.Module:
    """The large base with `method`'s adapter at the experiment's placement and rank (atlas loaded, CorDA fitted)."""
    from peft import get_peft_model
    from transformers import set_seed

    from kinfolk.plugins.atlas.comparators import corda_kpm_model, matching_lora_config

    base = context.family.load("large_base")
    atlas_config = context.atlas_config(RESIDUALS.get(method, "atlas"))
    set_seed(seed)  # the adapter's random initialisation (A), the same for every method of a family
    if method == "corda":
        return corda_kpm_model(base, atlas_config, context.fit_data, context.tokenizer, max_length=MAX_LENGTH)
    if method in RESIDUALS:
        model = get_peft_model(base, atlas_config)
        _tuner_layer(model).set_atlas("default", **context.atlas)
        return model
    return get_peft_model(base, matching_lora_config(base, atlas_config))


def train_run(
    context: Context,
    target: str,
    method: str,
    learning_rate: float,
    strength: float | None = None,
    keep_model: Path | None = None,
    measure_at_start: bool = False,
) -> dict[str, Any]:
    """One run: `method` learns `target` for `settings.steps` steps, measured every `checkpoint_every` steps (and
    before the first with `measure_at_start`; the fronts do not need it: every method starts at the frozen model)."""
    from transformers import TrainerCallback

    settings, seed = context.settings, context.seed
    model = build_adapter(context, method, seed)
    option = REGULARISERS.get(method)
    regulariser = {option: strength} if option else {}
    points: list[dict[str, Any]] = []

    class Checkpoints(TrainerCallback):
        def on_train_begin(self, args, state, control, model=None, **kwargs):
            if measure_at_start:
                points.append(measure(context, target, model, 0))

        def on_step_end(self, args, state, control, model=None, **kwargs):
            if state.global_step % settings.checkpoint_every == 0 or state.global_step == state.max_steps:
                points.append(measure(context, target, model, state.global_step))

    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as scratch:
        trainer = lab_trainer(
            model,
            corpus.ideal_dataset([target], settings.target_examples, seed + 1),
            context.tokenizer,
            scratch,
            settings.steps,
            learning_rate,
            seed=seed,
            batch_size=settings.batch_size,
            progress=False,
            retained_dataset=context.fit_data if regulariser else None,
            **regulariser,
        )
        trainer.add_callback(Checkpoints())
        trainer.train()
    if keep_model is not None:
        save_model(trainer.model, context.tokenizer, keep_model)
    return {
        "method": method,
        "learning_rate": learning_rate,
        "strength": strength,
        "points": points,
        "seconds": round(time.perf_counter() - start, 1),
    }


def run_name(method: str, learning_rate: float, strength: float | None) -> str:
    """The run's name (and file name) in a family's record.

    >>> run_name("lora+replay", 0.01, 0.25)
    'lora+replay-lr0.01-s0.25'
    """
    return f"{method}-lr{learning_rate:g}" + ("" if strength is None else f"-s{strength:g}")


def atlas_family(family: Family, work: Path, settings: AtlasSettings) -> dict[str, Any]:
    """One family's record: frozen scores, the atlas geometry, every run's checkpoints and the per-target analysis.
    Each run is kept under `work` as soon as it is done, so a stopped family resumes at its next run."""
    # a run is kept under the settings that made it: a changed step count or grid must not reuse it
    work = work / f"settings-{settings_key(dataclasses.asdict(settings))}"
    with single_threaded():
        context = prepare(family, settings)
        record: dict[str, Any] = {
            "layer": context.layer,
            "frozen": {
                skill: {split: context.frozen_score(skill, split) for split in SPLITS}
                for skill in [RETAINED, *settings.targets]
            },
            "geometry": geometry(context),
            "runs": {},
        }
        for target in settings.targets:
            runs = {}
            for method in settings.methods:
                for learning_rate in settings.rates(method):
                    for strength in settings.strengths(method):
                        name = run_name(method, learning_rate, strength)
                        runs[name] = cached_json(
                            work / target / f"{name}.json",
                            lambda t=target, m=method, lr=learning_rate, s=strength: train_run(context, t, m, lr, s),
                        )
            record["runs"][target] = runs
    record["analysis"] = {target: analyse_target(record, target) for target in settings.targets}
    return record


# ------------------------------------------------------------------------------------------------ fronts
Point = tuple[float, float]  # (target score, measure)


def front(points: Sequence[Point], level: float) -> float | None:
    """The front at `level`: the lowest measure among points scoring at least `level` (None when none does)."""
    reaching = [value for score, value in points if score >= level]
    return min(reaching) if reaching else None


def mean_log_ratio(method: Sequence[Point], baseline: Sequence[Point], low: float, high: float) -> float | None:
    """(1 / (high − low)) ∫ ln(front_method(k) / front_baseline(k)) dk over [low, high]: the area between the two
    fronts on a log axis, per unit of target score. Exact for the step fronts (constant on (a, b] between observed
    scores, at their value at b). None when either front does not reach `high`.

    >>> mean_log_ratio([(0.5, 1.0), (1.0, 4.0)], [(1.0, 2.0)], 0.0, 1.0)  # ln(1/2) on half, ln(4/2) on the rest
    0.0
    """
    cuts = sorted({low, high} | {score for score, _ in [*method, *baseline] if low < score < high})
    total = 0.0
    for a, b in itertools.pairwise(cuts):
        ours, theirs = front(method, b), front(baseline, b)
        if ours is None or theirs is None:
            return None
        total += (b - a) * (_log(ours) - _log(theirs))
    return total / (high - low)


def mean_difference(method: Sequence[Point], baseline: Sequence[Point], level: float) -> float | None:
    ours, theirs = front(method, level), front(baseline, level)
    return None if ours is None or theirs is None else ours - theirs


def log_ratio(method: Sequence[Point], baseline: Sequence[Point], level: float) -> float | None:
    ours, theirs = front(method, level), front(baseline, level)
    return None if ours is None or theirs is None else _log(ours) - _log(theirs)


def _log(value: float) -> float:
    return math.log(max(value, 1e-12))  # a trained checkpoint's KL is positive; the floor only guards log(0)


def _points(runs: dict[str, dict], names: Sequence[str], split: str, measure: str) -> list[Point]:
    return [(p[split]["target"], _measure(p[split], measure)) for name in names for p in runs[name]["points"]]


def _measure(entry: dict[str, Any], measure: str) -> float:
    """`kl`, or `forgot`: correct → wrong retained answers per frozen-correct problem."""
    return entry["kl"] if measure == "kl" else entry["F"] / max(entry["correct"], 1)


def select_runs(runs: dict[str, dict], names: Sequence[str], low: float, high: float) -> list[str]:
    """The runs among `names` that define their method's validation KL front somewhere in [low, high] (checked at
    every validation score there and at `high`: the front is constant in between), plus the run reaching the
    highest validation score (with the lowest KL there), so the chosen front extends as far as the method reaches."""
    scores = {p["validation"]["target"] for name in names for p in runs[name]["points"]}
    levels = sorted({high} | {score for score in scores if low <= score <= high})
    everything = _points(runs, names, "validation", "kl")
    chosen = set()
    for level in levels:
        best = front(everything, level)
        if best is not None:
            chosen |= {name for name in names if front(_points(runs, [name], "validation", "kl"), level) == best}

    def reach(name: str) -> tuple[float, float]:
        top = max(score for score, _ in _points(runs, [name], "validation", "kl"))
        return top, -front(_points(runs, [name], "validation", "kl"), top)

    chosen.add(max(names, key=reach))
    return [name for name in names if name in chosen]


def gain_levels(frozen: float, best: float) -> dict[str, float]:
    """Target levels as fractions of a gain: the fixed levels and the comparison range.

    >>> gain_levels(0.2, 0.6)
    {'mid': 0.4, 'plateau': 0.56, 'low': 0.24, 'high': 0.56}
    """
    gain = best - frozen
    levels = {name: frozen + fraction * gain for name, fraction in GAIN_LEVELS.items()}
    levels.update(low=frozen + AREA_RANGE[0] * gain, high=frozen + AREA_RANGE[1] * gain)
    return {name: round(value, 10) for name, value in levels.items()}


def analyse_target(record: dict[str, Any], target: str) -> dict[str, Any]:
    """Per method: the runs chosen on validation and, on test, its fronts at the levels, the areas against LoRA
    (and, for ATLAS, against the norm-matched control), its reach, the update norms at its front points."""
    runs = record["runs"][target]
    by_method: dict[str, list[str]] = {}
    for name, run in runs.items():
        by_method.setdefault(run["method"], []).append(name)
    frozen = record["frozen"][target]
    lora_validation = max(p["validation"]["target"] for n in by_method[BASELINE] for p in runs[n]["points"])
    validation = gain_levels(frozen["validation"], lora_validation)
    selected = {m: select_runs(runs, names, validation["low"], validation["high"]) for m, names in by_method.items()}
    lora_best = max(p["test"]["target"] for n in selected[BASELINE] for p in runs[n]["points"])
    analysis: dict[str, Any] = {
        "frozen": frozen["test"],
        "lora_best": lora_best,
        "selected": selected,
        "validation_levels": validation,
    }
    if lora_best - frozen["test"] < MIN_GAIN:
        analysis["undefined"] = (
            f"LoRA's best test score {lora_best:.3f} is less than {MIN_GAIN} above the frozen {frozen['test']:.3f}"
        )
        return analysis
    levels = gain_levels(frozen["test"], lora_best)
    analysis["levels"] = levels
    points = {
        m: {measure: _points(runs, names, "test", measure) for measure in ("kl", "forgot")}
        for m, names in selected.items()
    }
    methods = {}
    for method, names in selected.items():
        entry: dict[str, Any] = {
            "reach": max(score for score, _ in points[method]["kl"]),
            "front": _front_points(runs, names),
            "grid": {
                measure: [
                    front(points[method][measure], frozen["test"] + q * (lora_best - frozen["test"]))
                    for q in PLOT_GRID
                ]
                for measure in ("kl", "forgot")
            },
        }
        for name in GAIN_LEVELS:
            entry[name] = _at_level(runs, names, levels[name])
        comparisons = {BASELINE: points[BASELINE]} | (
            {CONTROL: points[CONTROL]} if method == "atlas" and CONTROL in points else {}
        )
        entry["versus"] = {
            other: {
                "area": mean_log_ratio(points[method]["kl"], theirs["kl"], levels["low"], levels["high"]),
                **{f"kl_{n}": log_ratio(points[method]["kl"], theirs["kl"], levels[n]) for n in GAIN_LEVELS},
                **{
                    f"forgot_{n}": mean_difference(points[method]["forgot"], theirs["forgot"], levels[n])
                    for n in GAIN_LEVELS
                },
            }
            for other, theirs in comparisons.items()
            if other != method
        }
        methods[method] = entry
    analysis["methods"] = methods
    return analysis


def _at_level(runs: dict[str, dict], names: Sequence[str], level: float) -> dict[str, Any] | None:
    """The test checkpoint that gives the KL front at `level` (lowest KL among those reaching it), with its norms."""
    reaching = [
        (p["test"]["kl"], name, p) for name in names for p in runs[name]["points"] if p["test"]["target"] >= level
    ]
    if not reaching:
        return None
    kl, name, point = min(reaching, key=lambda item: item[0])
    return {
        "run": name,
        "step": point["step"],
        "kl": kl,
        "target": point["test"]["target"],
        "forgot": _measure(point["test"], "forgot"),
        "norm_target": point["norm_target"],
        "norm_retained": point["norm_retained"],
    }


def _front_points(runs: dict[str, dict], names: Sequence[str]) -> list[dict[str, Any]]:
    """The test checkpoints on the method's KL front (none scores at least as high with lower KL), by score."""
    candidates = [(p["test"]["target"], p["test"]["kl"], name, p) for name in names for p in runs[name]["points"]]
    on_front = [c for c in candidates if not any(o[0] >= c[0] and o[1] < c[1] for o in candidates)]
    return [
        {
            "run": name,
            "step": p["step"],
            "target": score,
            "kl": kl,
            "forgot": _measure(p["test"], "forgot"),
            "norm_target": p["norm_target"],
            "norm_retained": p["norm_retained"],
        }
        for score, kl, name, p in sorted(on_front, key=lambda c: (c[0], c[1]))
    ]


# ------------------------------------------------------------------------------------------------ endpoints
def _method_entry(record: dict[str, Any], target: str, method: str) -> dict[str, Any] | None:
    return record["analysis"][target].get("methods", {}).get(method)


def _versus(target: str, method: str, other: str, key: str):
    def value(record: dict[str, Any]) -> list[float | None]:
        entry = _method_entry(record, target, method)
        return [None if entry is None else entry["versus"][other][key]]

    return value


def _reach(target: str, method: str):
    def value(record: dict[str, Any]) -> list[float | None]:
        entry = _method_entry(record, target, method)
        return [None if entry is None else entry["reach"] - record["analysis"][target]["lora_best"]]

    return value


def _norm_ratio(target: str, method: str, norm: str):
    def value(record: dict[str, Any]) -> list[float | None]:
        ours, theirs = _method_entry(record, target, method), _method_entry(record, target, BASELINE)
        if ours is None or ours["mid"] is None or theirs is None or theirs["mid"] is None:
            return [None]
        return [_log(ours["mid"][norm]) - _log(theirs["mid"][norm])]

    return value


def _geometry(target: str, key: str):
    def value(record: dict[str, Any]) -> list[float]:
        entry = record["geometry"][target]
        if key == "distance_ratio":
            return [entry["target_distance"] / entry["retained_distance"]]
        return [entry[key]]

    return value


COMPARISONS = {
    "area": "mean over the comparison range ({low:g}-{high:g} of LoRA's gain) of ln(KL_{method} / KL_{other}) between "
    "the test fronts",
    "kl_mid": "ln(KL_{method} / KL_{other}) at the mid level ({mid:g} of LoRA's gain), test fronts",
    "kl_plateau": "ln(KL_{method} / KL_{other}) near the plateau ({plateau:g} of LoRA's gain), test fronts",
}


def declare_endpoints(targets: Sequence[str] = TARGETS, methods: Sequence[str] = METHODS) -> list[Endpoint]:
    """Primary: per target, every method against LoRA and full ATLAS against the norm-matched control (the area
    between the KL fronts and the KL at the two levels; lower is better). Then the exploratory ones."""
    fractions = {"low": AREA_RANGE[0], "high": AREA_RANGE[1], **GAIN_LEVELS}
    pairs = [(m, BASELINE) for m in methods if m != BASELINE]
    if "atlas" in methods and CONTROL in methods:
        pairs.append(("atlas", CONTROL))
    endpoints = []
    for target in targets:
        for method, other in pairs:
            for key, text in COMPARISONS.items():
                endpoints.append(
                    Endpoint(
                        f"{target}/{method} {key} vs {other}",
                        f"{target}: " + text.format(method=method, other=other, **fractions),
                        _versus(target, method, other, key),
                        baseline=other,
                        primary=True,
                        higher_is_better=False,
                    )
                )
    for target in targets:
        for method in methods:
            if method == BASELINE:
                continue
            for level in GAIN_LEVELS:
                endpoints.append(
                    Endpoint(
                        f"{target}/{method} forgot_{level} vs {BASELINE}",
                        f"{target}: retained answers turned correct → wrong per frozen-correct problem, {method} minus "
                        f"LoRA, at the {level} level (test fronts)",
                        _versus(target, method, BASELINE, f"forgot_{level}"),
                        baseline=BASELINE,
                        higher_is_better=False,
                    )
                )
            endpoints.append(
                Endpoint(
                    f"{target}/{method} reach vs {BASELINE}",
                    f"{target}: {method}'s best test score among its chosen runs minus LoRA's",
                    _reach(target, method),
                    baseline=BASELINE,
                )
            )
            for norm in ("norm_target", "norm_retained"):
                endpoints.append(
                    Endpoint(
                        f"{target}/{method} {norm} vs {BASELINE}",
                        f"{target}: ln of the mean per-token update norm on {norm.split('_')[1]} tokens, {method} over "
                        "LoRA, at their front points of the mid level",
                        _norm_ratio(target, method, norm),
                        baseline=BASELINE,
                        higher_is_better=False,
                    )
                )
        for key, text in (
            ("distance_ratio", "mean routed distance of target tokens over that of held-out retained tokens"),
            ("target_beyond_retained_p95", "share of target tokens farther from the atlas than 95 % of retained ones"),
            ("target_rho", "mean ρ(h) (ATLAS's PCA scale) on target tokens"),
            ("retained_rho", "mean ρ(h) on held-out retained tokens"),
        ):
            endpoints.append(Endpoint(f"{target}/geometry {key}", f"{target}: {text}", _geometry(target, key)))
    return endpoints


ENDPOINTS = declare_endpoints()


# ------------------------------------------------------------------------------------------------ fronts and plot
def fronts_summary(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The test fronts of every family on a common axis (fractions of LoRA's gain, `PLOT_GRID`), for the plot."""
    fronts: dict[str, Any] = {}
    for record in records:
        for target, analysis in record["analysis"].items():
            entry = fronts.setdefault(target, {"grid": list(PLOT_GRID), "families": {}})
            entry["families"][str(record["family_seed"])] = {
                "frozen": analysis["frozen"],
                "lora_best": analysis["lora_best"],
                "selected": analysis["selected"],
                "methods": {m: e["grid"] for m, e in analysis.get("methods", {}).items()},
            }
    return {"fronts": fronts}


def plot_fronts(results: dict[str, Any], path: str | Path) -> Path:
    """Retained KL (log axis) and correct → wrong answers against the target gain, one column per target: each
    family's front as a thin line, the mean over families (geometric for KL) as a thick one where every family's
    front reaches."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fronts = results["fronts"]
    measures = {"kl": "retained KL (test)", "forgot": "correct → wrong / frozen-correct (test)"}
    figure, axes = plt.subplots(2, len(fronts), figsize=(5.5 * len(fronts), 7), squeeze=False)
    colours = dict(zip(METHODS, plt.rcParams["axes.prop_cycle"].by_key()["color"] * 2))
    for column, (target, entry) in enumerate(fronts.items()):
        grid = np.asarray(entry["grid"])
        methods = sorted({m for family in entry["families"].values() for m in family["methods"]}, key=METHODS.index)
        for row, (measure, label) in enumerate(measures.items()):
            axis = axes[row][column]
            for method in methods:
                curves = [f["methods"][method][measure] for f in entry["families"].values() if method in f["methods"]]
                values = [[np.nan if v is None else v for v in curve] for curve in curves]
                plot_families(axis, grid, values, colours[method], method, geometric=measure == "kl")
            if measure == "kl":
                axis.set_yscale("log")
            axis.set_ylabel(label)
            axis.set_xlabel("target gain, as a fraction of LoRA's (0: frozen, 1: LoRA's best)")
            axis.set_title(f"{target} ({len(entry['families'])} families)")
    axes[0][0].legend(fontsize=7)
    return save_figure(figure, path, dpi=110)


def run_atlas(
    out: str | Path,
    families: list[int],
    settings: AtlasSettings | None = None,
    quick: bool = False,
    **options,
) -> dict[str, Any]:
    """The experiment over `families` (family seeds); `options` go to `replication.run_families`. Writes
    `results.json` (with every family's fronts) and `fronts.png` to `out`."""
    settings = settings or AtlasSettings()
    results = run_families(
        "atlas",
        out,
        families,
        lambda seed: family_config(seed, settings, quick),
        lambda family, work: atlas_family(family, work, settings),
        declare_endpoints(settings.targets, settings.methods),
        {**dataclasses.asdict(settings), "quick": quick},
        summary=fronts_summary,
        **options,
    )
    plot_fronts(results, Path(out) / "fronts.png")
    return results


if __name__ == "__main__":  # python -m kinfolk.lab.atlas_experiment RESULTS.json FIGURE.png
    import json
    import sys

    plot_fronts(json.loads(Path(sys.argv[1]).read_text()), sys.argv[2])
