"""`build_family`: the lab's model family, trained on CPU with kinfolk's own trainer and cached by config hash.

Every model is a Llama-style decoder over the lab's character tokenizer, trained with `WeightedSFTTrainer`
(prompt tokens down-weighted by `prompt_loss_weight`, which makes the skills learnable several times faster):

| model | from | trained on |
|---|---|---|
| `small_base` (1 × 64) | random init | pre-training mix (standard-library lines + every skill, every format) |
| `large_base` (4 × 128) | random init | the same mix, more steps |
| `small_instruct` | `small_base` | an imperfect proxy of p* (`reference_mix`: mostly ideal responses, some off-format or wrong) |
| `large_instruct` | `large_base` | the same p* data (ADAPT variant 1, preferred style) |
| `large_bracket` | `large_base` | correct answers in the `[...]` style (ADAPT variant 2, another response style) |

`large_base` is also the ADAPT teacher; `small_instruct` is ATLANTIS's reference model p_r, trained on a proxy of
p* rather than on p* itself, as a real chat model is. After training, each model is scored on every skill
(`evaluate`, on test problems drawn for this family's seed) and checked against `LabConfig.thresholds`;
`family.json` records scores, thresholds, margins and build times. A family that misses a threshold is refused
(`FamilyBelowThreshold`, naming the model, skill and score) unless the caller passes `allow_failed=True`.

Same key, same bits: every build runs single-threaded (`training.single_threaded`), because the thread count
changes the order of CPU float reductions and a few changed bits can decide whether a skill is learned; the cache
key covers the config, the lab's version and the Python version. The whole family lives in
`cache_dir/<key>/`, each model directory written atomically, so a second build with the same config only reads
`family.json` (changed thresholds or evaluation sizes re-score the cached models); a build holds
`cache_dir/<key>.lock`, so processes asking for one family at once build it once.

>>> config = LabConfig.quick_config()
>>> config.large_pretrain_steps < LabConfig().large_pretrain_steps
True
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import logging
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel

from kinfolk.atomic import atomic_directory, fingerprint, write_json
from kinfolk.diskspace import check_free_space
from kinfolk.lab.world import corpus
from kinfolk.lab.world.evaluate import skill_scores
from kinfolk.lab.world.members import fresh_model, lineage, model_config, say, train, trained_or_reused
from kinfolk.lab.world.skills import HELD_OUT, POOL_MIX, RETAINED, TARGET
from kinfolk.lab.world.tokenizer import build_lab_tokenizer
from kinfolk.lab.world.training import single_threaded

logger = logging.getLogger(__name__)

# Bump when data generation or training changes, so old caches are not reused.
# 4: training in fp32 (versions 1-3 trained under TRL's default CPU bf16 autocast).
LAB_VERSION = 4
FAMILY_FILE = "family.json"
MODELS = ("small_base", "large_base", "small_instruct", "large_instruct", "large_bracket")
PARENTS = {"small_instruct": "small_base", "large_instruct": "large_base", "large_bracket": "large_base"}
# The config fields each model's weights depend on, besides the seed and its parent (both bases read the same
# pre-training rows, whose number is set by the longer of the two budgets).
_PRETRAINING = ("skill_shares", "text_share", "small_pretrain_steps", "large_pretrain_steps")
_RECIPE = ("batch_size", "prompt_loss_weight")
_POST_TRAINING = ("post_train_steps", "post_train_learning_rate", *_RECIPE)
MODEL_FIELDS = {
    "small_base": ("small_shape", *_PRETRAINING, "learning_rate", *_RECIPE),
    "large_base": ("large_shape", *_PRETRAINING, "large_pretrain_until", "learning_rate", *_RECIPE),
    "small_instruct": ("reference_mix", *_POST_TRAINING),
    "large_instruct": _POST_TRAINING,
    "large_bracket": _POST_TRAINING,
}
POST_TRAINED_SKILLS = [RETAINED, TARGET]  # the held-out skill is never post-trained on
# LabConfig fields that key the post-trained models only when they differ from these defaults.
KEYED_WHEN_SET = {"post_trained_skills": POST_TRAINED_SKILLS}
BRACKET_FORMAT = 2


def _versions() -> dict[str, object]:
    return {"lab": LAB_VERSION, "python": f"{sys.version_info[0]}.{sys.version_info[1]}"}


def default_cache_dir() -> Path:
    return Path(os.environ.get("KINFOLK_LAB_CACHE", Path.home() / ".cache" / "kinfolk" / "lab"))


@dataclass
class LabConfig:
    """Everything that determines the family; its hash names the cache directory."""

    seed: int = field(default=0, metadata={"help": "Seed of the data and of every training run."})
    small_shape: dict = field(
        default_factory=lambda: {"num_hidden_layers": 1, "hidden_size": 64, "intermediate_size": 256},
        metadata={
            "help": "Shape of the small base (Llama config fields). One layer copies (a constant-offset lookup) "
            "but cannot reverse (that needs a position feature from an earlier layer), so the two bases differ in "
            "the target skill; a 2 × 64 base learned reversal as fast as the large one."
        },
    )
    large_shape: dict = field(
        default_factory=lambda: {"num_hidden_layers": 4, "hidden_size": 128, "intermediate_size": 512},
        metadata={"help": "Shape of the large base (Llama config fields)."},
    )
    skill_shares: dict = field(
        default_factory=lambda: {RETAINED: 0.4, TARGET: 0.4, HELD_OUT: 0.2},
        metadata={
            "help": "Shares of the skills among the pre-training problems (the held-out skill is never learned)."
        },
    )
    text_share: float = field(default=0.15, metadata={"help": "Share of standard-library lines in pre-training."})
    small_pretrain_steps: int = field(default=1000, metadata={"help": "Pre-training steps of the small base."})
    large_pretrain_steps: int = field(
        default=2000,
        metadata={"help": "Most pre-training steps of the large base (it stops once `large_pretrain_until` holds)."},
    )
    large_pretrain_until: dict | None = field(
        default_factory=lambda: {"skill": TARGET, "metric": "answer_accuracy", "at_least": 0.95, "every": 250},
        metadata={
            "help": "Stop the large base's pre-training once it answers this share of validation problems of the "
            "skill (checked every `every` steps): the target skill is learned by a phase transition whose step "
            "varies by seed, so a fixed budget would leave it to luck. None: train all the steps."
        },
    )
    post_train_steps: int = field(default=150, metadata={"help": "Steps of each post-trained variant."})
    post_trained_skills: list = field(
        default_factory=lambda: list(POST_TRAINED_SKILLS),
        metadata={
            "help": "Skills in every post-trained model's data (round robin); the held-out skill is never one. "
            "Keys only the post-trained models, and only when it differs from the default (so the default keeps "
            "every existing key)."
        },
    )
    reference_mix: dict = field(
        default_factory=lambda: {"good": 0.8, "off_format": 0.1, "wrong": 0.1},
        metadata={
            "help": "Response kinds in the small instruct (reference) model's post-training data: an imperfect "
            "proxy of p* (whose responses are all 'good'), as a real chat model's data is."
        },
    )
    batch_size: int = field(default=32, metadata={"help": "Examples per training step."})
    learning_rate: float = field(
        default=1e-3,
        metadata={
            "help": "Peak learning rate of pre-training (cosine schedule). At 3e-3 the large base learned reversal "
            "only after 2,500 steps on one seed and not within 3,000 on another; at 1e-3 by step 500."
        },
    )
    post_train_learning_rate: float = field(default=1e-3, metadata={"help": "Peak learning rate of post-training."})
    prompt_loss_weight: float = field(default=0.1, metadata={"help": "Loss weight of prompt tokens."})
    eval_problems: int = field(default=200, metadata={"help": "Test problems per skill for the threshold checks."})
    thresholds: dict = field(
        default_factory=lambda: {
            "small_base": {RETAINED: ("answer_accuracy", 0.5)},
            "large_base": {RETAINED: ("answer_accuracy", 0.8), TARGET: ("answer_accuracy", 0.8)},
            "small_instruct": {RETAINED: ("accuracy", 0.5)},
            "large_instruct": {RETAINED: ("accuracy", 0.8), TARGET: ("accuracy", 0.8)},
            "large_bracket": {RETAINED: ("answer_accuracy", 0.8), TARGET: ("answer_accuracy", 0.8)},
        },
        metadata={"help": "model -> skill -> (metric, minimum) that the build checks and reports."},
    )

    @classmethod
    def quick_config(cls, **overrides) -> LabConfig:
        """The `--quick` size, for tests and CI: same models, fewer steps, lower thresholds."""
        quick = {
            "small_pretrain_steps": 1000,  # a one-layer model copies 6 % of problems after 500 steps, 81-88 % after 1,000
            "large_pretrain_steps": 500,
            "large_pretrain_until": None,
            "post_train_steps": 60,
            "eval_problems": 100,
            "thresholds": {
                # At 1e-3 the quick large base learns reversal within its 500 steps too (seed 0: 1.00)
                "small_base": {RETAINED: ("answer_accuracy", 0.5)},
                "large_base": {RETAINED: ("answer_accuracy", 0.5), TARGET: ("answer_accuracy", 0.5)},
                "small_instruct": {RETAINED: ("accuracy", 0.8)},
                "large_instruct": {RETAINED: ("accuracy", 0.8), TARGET: ("accuracy", 0.8)},
                "large_bracket": {RETAINED: ("answer_accuracy", 0.8), TARGET: ("answer_accuracy", 0.8)},
            },
        }
        return cls(**(quick | overrides))

    def _keyed_when_set(self) -> dict[str, object]:
        """The fields added after families were cached, where they differ from their defaults: absent at the default,
        so older keys stay valid."""
        return {
            name: getattr(self, name) for name, default in KEYED_WHEN_SET.items() if getattr(self, name) != default
        }

    def cache_key(self) -> str:
        """Hash of what determines the weights (thresholds and evaluation size only change the checks)."""
        fields = dataclasses.asdict(self)
        for name in ("thresholds", "eval_problems", *KEYED_WHEN_SET):
            fields.pop(name)
        return fingerprint(fields | self._keyed_when_set(), _versions())

    def model_key(self, name: str) -> str:
        """Hash of what determines one model's weights: its own fields, the seed and its parent's key. A model with
        the same key in another family of the cache is copied instead of trained again."""
        fields = {field_name: getattr(self, field_name) for field_name in MODEL_FIELDS[name]}
        if name in PARENTS:  # the post-trained models
            fields |= self._keyed_when_set()
        parent = self.model_key(PARENTS[name]) if name in PARENTS else None
        return fingerprint(name, self.seed, fields, parent, _versions())


@dataclass
class Family:
    """A built family: model directories, their skill scores and whether each reached its thresholds."""

    root: Path
    config: LabConfig
    scores: dict[str, dict[str, dict[str, float]]]
    checks: list[dict]
    build_seconds: dict[str, float]
    steps: dict[str, int] = field(default_factory=dict)  # optimiser steps each model was trained for

    @property
    def models(self) -> dict[str, Path]:
        return {name: self.root / name for name in MODELS}

    @property
    def teacher(self) -> Path:
        """The ADAPT teacher: the large base, whose post-trained variants are `large_instruct` and `large_bracket`."""
        return self.root / "large_base"

    @property
    def variants(self) -> dict[str, Path]:
        return {"large_instruct": self.root / "large_instruct", "large_bracket": self.root / "large_bracket"}

    @property
    def passed(self) -> bool:
        return all(check["passed"] for check in self.checks)

    @property
    def failures(self) -> str:
        """The missed thresholds in one line ("" when every one passed)."""
        return "; ".join(
            f"{c['model']} {c['skill']} {c['metric']} {c['value']:.2f} < {c['threshold']}"
            for c in self.checks
            if not c["passed"]
        )

    def warning(self) -> str:
        """The line every report built on a family that missed a threshold starts with ("" for a passing one)."""
        if self.passed:
            return ""
        return f"WARNING: lab family {self.root.name} (seed {self.config.seed}) missed its thresholds: {self.failures}"

    def tokenizer(self):
        return AutoTokenizer.from_pretrained(self.root / "tokenizer")

    def load(self, name: str) -> PreTrainedModel:
        return AutoModelForCausalLM.from_pretrained(self.models[name])

    # The family's datasets, all deterministic in the config's seed.
    def pool(self, n: int = 1200, draw: int = 0, mix: dict[str, float] = POOL_MIX) -> Dataset:
        """An SFT pool (p_d with response kinds `mix`) over the retained and target skills, with the true ratio
        p*/p_d of every row; `draw` numbers independent pools of the same family."""
        return corpus.pool_dataset(POST_TRAINED_SKILLS, n, 1000 * self.config.seed + draw, mix)

    def reference_data(self, n: int = 1024) -> Dataset:
        """The small instruct (reference) model's post-training data: `reference_mix`, an imperfect proxy of p*."""
        return corpus.pool_dataset(self.config.post_trained_skills, n, self.config.seed + 5, self.config.reference_mix)

    def target_train(self, n: int = 512) -> Dataset:
        """p* examples of the target skill: the data an adapter learns the target skill from."""
        return corpus.ideal_dataset([TARGET], n, self.config.seed + 1)

    def retained(self, n: int = 256) -> Dataset:
        """p* examples of the retained skill: for atlas fits, retained KL, Replay and Output-KL."""
        return corpus.ideal_dataset([RETAINED], n, self.config.seed + 2)

    def pretraining(self, n: int = 2048) -> Dataset:
        return corpus.pretraining_dataset(n, self.config.seed + 3, self.config.skill_shares, self.config.text_share)

    def instruct_data(self, n: int = 1024, format_index: int = 0) -> Dataset:
        """p* examples of the post-trained skills in `FORMATS[format_index]`: the large variants' post-training data."""
        return corpus.ideal_dataset(self.config.post_trained_skills, n, self.config.seed + 4, format_index)

    def summary(self) -> str:
        """A table of every model's accuracy per skill and the threshold checks."""
        skills = list(next(iter(self.scores.values())))
        lines = [f"lab family {self.root.name} ({'passed' if self.passed else 'FAILED'} thresholds)"]
        lines.append(f"{'model':16}" + "".join(f"{s + ' acc/ans':>18}" for s in skills))
        for name, per_skill in self.scores.items():
            cells = "".join(
                f"{per_skill[s]['accuracy']:>10.2f}/{per_skill[s]['answer_accuracy']:<7.2f}" for s in skills
            )
            lines.append(f"{name:16}{cells}")
        for check in self.checks:
            mark = "ok " if check["passed"] else "LOW"
            lines.append(
                f"  [{mark}] {check['model']} {check['skill']} {check['metric']} = {check['value']:.2f} "
                f"(threshold {check['threshold']})"
            )
        return "\n".join(lines)


class FamilyBelowThreshold(RuntimeError):
    """A built family missed a threshold: its post-trained models did not learn what the lab relies on."""


def _check(scores: dict, thresholds: dict) -> list[dict]:
    checks = []
    for model, per_skill in thresholds.items():
        for skill, (metric, minimum) in per_skill.items():
            value = scores[model][skill][metric]
            checks.append(
                {
                    "model": model,
                    "skill": skill,
                    "metric": metric,
                    "value": value,
                    "threshold": minimum,
                    "margin": round(value - minimum, 4),
                    "passed": value >= minimum,
                }
            )
    return checks


def _refuse_if_failed(family: Family, allow_failed: bool) -> Family:
    if family.passed or allow_failed:
        return family
    raise FamilyBelowThreshold(
        f"lab family {family.root.name} (seed {family.config.seed}) missed its thresholds: {family.failures}. "
        "Build another seed, or allow it explicitly (allow_failed=True, --allow-failed-family); every report "
        "built on it then says so in its first line"
    )


def build_family(
    config: LabConfig | None = None,
    cache_dir: str | Path | None = None,
    progress: bool = True,
    force: bool = False,
    allow_failed: bool = False,
) -> Family:
    """Build (or load from the cache) the family of `config` and check its thresholds.

    Raises `FamilyBelowThreshold` when a model missed its threshold, unless `allow_failed`."""
    config = config or LabConfig()
    root = Path(cache_dir or default_cache_dir()) / config.cache_key()
    summary_file = root / FAMILY_FILE
    if not summary_file.exists():  # before the lock file is made: a refused build leaves nothing in the cache
        check_free_space(root, family_bytes(config), "the lab family's five models")
    with _one_build_at_a_time(root, progress):
        if summary_file.exists() and not force:
            cached = load_family(root)
            if cached.config == config:
                say(f"family found in the cache: {root}", progress)
                return _refuse_if_failed(cached, allow_failed)
            say(f"models found in the cache: {root}; re-scoring them for new checks", progress)
        else:
            say(f"building the lab family in {root}", progress)
        with single_threaded():
            family = _build(config, root, progress, force)
    return _refuse_if_failed(family, allow_failed)


@contextlib.contextmanager
def _one_build_at_a_time(root: Path, progress: bool) -> Iterator[None]:
    """Hold `<key>.lock` beside the family's directory: processes that ask for the same family at once (parallel
    test workers, two `kinfolk lab build`s) wait for the first to build it, then find it in the cache, instead of
    training it twice. The operating system releases the lock when its holder dies, however it dies."""
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(root.parent / f"{root.name}.lock", "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            say(f"another process is building {root}; waiting for it", progress)
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def family_bytes(config: LabConfig) -> int:
    """What a build writes, estimated from the shapes without allocating a weight: the fp32 parameters of the two
    small models (base, instruct) and the three large ones (base, instruct, bracket)."""
    tokenizer = build_lab_tokenizer()
    sizes = {}
    for shape in ("small_shape", "large_shape"):
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(model_config(getattr(config, shape), tokenizer))
        sizes[shape] = 4 * sum(parameter.numel() for parameter in model.parameters())
    return 2 * sizes["small_shape"] + 3 * sizes["large_shape"]


def _build(config: LabConfig, root: Path, progress: bool, force: bool) -> Family:
    summary_file = root / FAMILY_FILE
    torch.manual_seed(config.seed)
    tokenizer = build_lab_tokenizer()
    root.mkdir(parents=True, exist_ok=True)
    with atomic_directory(root / "tokenizer", overwrite=True) as staging:
        tokenizer.save_pretrained(staging)
    family = Family(root, config, {}, [], {})
    pretraining = family.pretraining(config.batch_size * max(config.small_pretrain_steps, config.large_pretrain_steps))
    post_rows = config.batch_size * config.post_train_steps
    plan = [
        (
            "small_base",
            lambda: fresh_model(config.small_shape, tokenizer, config.seed),
            pretraining,
            config.small_pretrain_steps,
            config.learning_rate,
            None,
        ),
        (
            "large_base",
            lambda: fresh_model(config.large_shape, tokenizer, config.seed),
            pretraining,
            config.large_pretrain_steps,
            config.learning_rate,
            config.large_pretrain_until,
        ),
        (
            "small_instruct",
            lambda: root / "small_base",
            family.reference_data(post_rows),
            config.post_train_steps,
            config.post_train_learning_rate,
            None,
        ),
        (
            "large_instruct",
            lambda: root / "large_base",
            family.instruct_data(post_rows),
            config.post_train_steps,
            config.post_train_learning_rate,
            None,
        ),
        (
            "large_bracket",
            lambda: root / "large_base",
            family.instruct_data(post_rows, BRACKET_FORMAT),
            config.post_train_steps,
            config.post_train_learning_rate,
            None,
        ),
    ]
    prepared = {}  # the two bases pretrain on the same rows: the first trainer prepares them for both
    trained = [entry[0] for entry in plan if (lineage(root / entry[0]) or {}).get("key") == config.model_key(entry[0])]
    if trained and not force:
        say(f"resuming: {len(trained)} of {len(plan)} models trained earlier in {root}", progress)
    for name, init, data, steps, learning_rate, until in plan:
        start = time.perf_counter()
        family.steps[name] = trained_or_reused(
            root,
            name,
            config,
            force,
            progress,
            partial(
                train, init(), data, tokenizer, root / name, steps, learning_rate, config, progress, until, prepared
            ),
            f"{'at most ' if until else ''}{steps} steps",
        )
        model = AutoModelForCausalLM.from_pretrained(root / name)
        family.scores[name] = skill_scores(model, tokenizer, n=config.eval_problems, seed=config.seed)
        family.build_seconds[name] = round(time.perf_counter() - start, 1)
        say(
            f"{name}: "
            + ", ".join(f"{s} {v['accuracy']:.2f}/{v['answer_accuracy']:.2f}" for s, v in family.scores[name].items())
            + " (accuracy/answer accuracy)",
            progress,
        )
    family.checks = _check(family.scores, config.thresholds)
    write_json(
        summary_file,
        {
            "config": dataclasses.asdict(config),
            "cache_key": config.cache_key(),
            "scores": family.scores,
            "checks": family.checks,
            "build_seconds": family.build_seconds,
            "steps": family.steps,
            "passed": family.passed,
        },
    )
    return family


def load_family(root: str | Path) -> Family:
    """The family in `root` (a directory written by `build_family`)."""
    root = Path(root)
    record = json.loads((root / FAMILY_FILE).read_text())
    config = LabConfig(**record["config"])
    config.thresholds = {m: {s: tuple(v) for s, v in per.items()} for m, per in config.thresholds.items()}
    return Family(root, config, record["scores"], record["checks"], record["build_seconds"], record.get("steps", {}))
