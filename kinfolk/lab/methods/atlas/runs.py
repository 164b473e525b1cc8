"""One ATLAS lab family's measurements and training runs: checkpoints measured on validation and test."""

from __future__ import annotations

import contextlib
import tempfile
import time
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from datasets import Dataset

from kinfolk.lab.methods.atlas.settings import REGULARISERS, SPLITS, AtlasSettings, registry_method
from kinfolk.lab.world import corpus
from kinfolk.lab.world.family import Family
from kinfolk.lab.world.skills import RETAINED, answer_of, render
from kinfolk.lab.world.tokenizer import MAX_LENGTH
from kinfolk.lab.world.training import lab_trainer, save_model


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

    def atlas_config(self):
        """ATLAS's adapter at the experiment's placement and rank: every method's placement (`adapter_model`)."""
        from kinfolk.plugins.atlas import AtlasConfig

        s = self.settings
        return AtlasConfig(
            r=s.rank,
            num_regions=s.regions,
            layers_to_transform=[self.layer],
            target_modules=[s.module],
        )


def accuracy(problems: Dataset, responses: list[str]) -> float:
    """Share of responses that are the correct answer in the preferred format."""
    return float(np.mean([r == render(a) for r, a in zip(responses, problems["answer"])]))


def churn(problems: Dataset, frozen: list[str], current: list[str]) -> dict[str, int]:
    """Answer content against the frozen model's (`kinfolk.drift.churn`): C changed, F correct → wrong,
    G wrong → correct, W wrong → other wrong; `correct` = the frozen model's correct answers (F's opportunities)."""
    from kinfolk.drift.churn import Outcome, churn_counts

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
    from kinfolk.lab.world.evaluate import generate_responses
    from kinfolk.plugins.atlas import fit_atlas
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
    context.atlas = atlas_buffers(template)
    return context


def atlas_buffers(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A copy of the one ATLAS layer's fitted atlas, by `set_atlas`'s keyword names."""
    from kinfolk.plugins.atlas.layer import ATLAS_BUFFERS

    layer = tuner_layer(model)
    return {name[6:]: getattr(layer, name)["default"].detach().clone() for name in ATLAS_BUFFERS}


def tuner_layer(model: torch.nn.Module) -> torch.nn.Module:
    """The one PEFT tuner layer of an adapter placed at a single module (the lab adapts one)."""
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
    layer = tuner_layer(model)
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
    from kinfolk.lab.world.evaluate import generate_responses

    was_training = model.training
    model.eval()
    skills = [target, RETAINED]
    prompts = [p for split in SPLITS for skill in skills for p in context.problems[split][skill]["prompt"]]
    responses = iter(generate_responses(model, context.tokenizer, prompts))
    point: dict[str, Any] = {"step": step}
    module = tuner_layer(model)
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
    from transformers import set_seed

    from kinfolk.plugins.atlas_comparators import corda_kpm_model

    base = context.family.load("large_base")
    set_seed(seed)  # the adapter's random initialisation (A), the same for every method of a family
    if method == "corda":
        return corda_kpm_model(
            base, context.atlas_config(), context.fit_data, context.tokenizer, max_length=MAX_LENGTH
        )
    return adapter_model(base, method, context.atlas_config(), context.atlas)


def adapter_model(
    base: torch.nn.Module, method: str, placement: Any, atlas: dict[str, torch.Tensor]
) -> torch.nn.Module:
    """`base` with the lab method's adapter (`registry_method`, `kinfolk compare`'s registry) at `placement` (an
    `AtlasConfig`), the fitted `atlas` loaded into an ATLAS adapter."""
    from peft import get_peft_model

    spec = registry_method(method)
    model = get_peft_model(base, spec.peft_config(base, placement))
    if spec.fits_atlas:
        tuner_layer(model).set_atlas("default", **atlas)
    return model


def train_run(
    context: Context,
    target: str,
    method: str,
    learning_rate: float,
    strength: float | None = None,
    keep_model: Path | None = None,
    measure_at_start: bool = False,
    seed: int | None = None,
    measure_point: Callable[[Context, str, torch.nn.Module, int], dict[str, Any]] | None = None,
    checkpoint_steps: Collection[int] | None = None,
) -> dict[str, Any]:
    """One run: `method` learns `target` for `settings.steps` steps, measured (by `measure_point`, default `measure`)
    every `checkpoint_every` steps (or at `checkpoint_steps`), at the last step, and before the first with
    `measure_at_start` (the fronts do not need it: every method starts at the frozen model). `seed` draws the
    adapter's initialisation and the data order (default: the family's seed)."""
    from transformers import TrainerCallback

    settings = context.settings
    seed = context.seed if seed is None else seed
    measure_point = measure_point or measure
    model = build_adapter(context, method, seed)
    option = REGULARISERS.get(method)
    regulariser = {option: strength} if option else {}
    points: list[dict[str, Any]] = []

    class Checkpoints(TrainerCallback):
        def on_train_begin(self, args, state, control, model=None, **kwargs):
            if measure_at_start:
                points.append(measure_point(context, target, model, 0))

        def on_step_end(self, args, state, control, model=None, **kwargs):
            scheduled = (
                state.global_step in checkpoint_steps
                if checkpoint_steps is not None
                else state.global_step % settings.checkpoint_every == 0
            )
            if scheduled or state.global_step == state.max_steps:
                points.append(measure_point(context, target, model, state.global_step))

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
