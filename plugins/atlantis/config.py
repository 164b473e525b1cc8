"""Typed options for ATLANTIS scoring and weighting, TRL-style dataclasses that `TrlParser` / YAML parse.

`WeightConfig` holds everything that turns cached log-probs into weights (re-runnable without a forward pass);
`ScoreConfig` adds what the forward passes need. Every field carries its help text.

Defaults and why: `formula="ratio"` is the paper's derived importance ratio (Eq. 7, w = p_bL / p_bS); the
pseudocode's extra p_r factor (`algorithm1`) multiplies by an absolute likelihood, which is not a density
ratio and grows with length. `normalization="byte"` divides the log ratio by the response's UTF-8 bytes: a
whole-sequence log ratio grows linearly with length, so its exponential is dominated by long responses (the
heavy tails the paper's figures cannot show), and bytes, unlike tokens, mean the same thing for every tokenizer,
so the same default serves same-family and cross-family model triples. A mild 1%/99% quantile clip guards
against the few rows a small model finds absurd; weights are then self-normalised to mean 1, so the weighted
loss keeps plain SFT's scale. On the lab (docs/results.md, atlantis-controls: 5 families, 2 runs each) no weighting
was shown to help after Holm's correction: `ratio` gained +0.23 [+0.05, +0.42] over uniform SFT with a tuned rate,
and weights from the large base's own log-prob alone gained as much, so the small models added nothing detectable
there; on answer-format noise, which the two bases cannot see, `algorithm1` was ahead of `ratio` in 5 of 5 families
(+0.27 [+0.05, +0.49]), also not significant after correction. Hence `large_base_only` (log w = a): the lab's
`a-only` arm, the same transforms on a alone, which needs the large base only and no small models at scoring time.

>>> config = WeightConfig(formula="influence", temperature=0.5)
>>> config.roles
('small_base', 'reference')
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

# Model roles, in the order they are scored and reported.
ROLES = ("large_base", "small_base", "reference")

# Each formula is a signed sum of role log-probs: log w = Σ sign · log p_role(y|x).
FORMULAS: dict[str, dict[str, int]] = {
    "ratio": {"large_base": 1, "small_base": -1},  # Eq. 7
    "algorithm1": {"large_base": 1, "small_base": -1, "reference": 1},  # the paper's Algorithm 1
    "influence": {"reference": 1, "small_base": -1},  # Eq. 8
    # the large base alone (the model SFT trains): as good as `ratio` on the lab, and needs one model, not three
    "large_base_only": {"large_base": 1},
}

NORMALIZATIONS = ("none", "token", "byte")
CLIP_MODES = ("none", "quantile", "absolute")

RESPONSE_BYTES_COLUMN = "response_bytes"


def logprob_column(role: str) -> str:
    return f"{role}_logprob"


def tokens_column(role: str) -> str:
    return f"{role}_tokens"


@dataclass
class WeightConfig:
    """How per-model response log-probs become one weight per example; all arithmetic is in log space."""

    formula: Literal["ratio", "algorithm1", "influence", "large_base_only"] = field(
        default="ratio",
        metadata={
            "help": "log-weight formula over a = large base, b = small base, c = reference log-probs: "
            "'ratio' a-b (Eq. 7), 'algorithm1' a-b+c (the paper's pseudocode; also sees answer-format noise, "
            "which the two bases cannot), 'influence' c-b (Eq. 8), 'large_base_only' a (needs only the large "
            "base; as good as 'ratio' on the lab). None was shown to beat tuned uniform SFT on the lab "
            "(docs/results.md; how to choose: docs/atlantis.md)."
        },
    )
    normalization: Literal["none", "token", "byte"] = field(
        default="byte",
        metadata={
            "help": "length normalisation of each log-prob: 'none' (whole sequence), 'token' (divide each model's "
            "log-prob by its own response token count) or 'byte' (divide by the response's UTF-8 bytes; the only "
            "one comparable across tokenizers)."
        },
    )
    temperature: float = field(
        default=1.0,
        metadata={"help": "log weights are divided by it: < 1 sharpens, > 1 flattens towards plain SFT."},
    )
    clip: Literal["none", "quantile", "absolute"] = field(
        default="quantile",
        metadata={
            "help": "clip log weights before self-normalisation: 'quantile' at clip_quantiles, 'absolute' at "
            "clip_weights (bounds relative to the mean weight), or 'none'."
        },
    )
    clip_quantiles: list[float] = field(
        default_factory=lambda: [0.01, 0.99],
        metadata={"help": "lower and upper quantiles for clip='quantile'."},
    )
    clip_weights: list[float] = field(
        default_factory=lambda: [0.1, 10.0],
        metadata={"help": "lower and upper weight bounds, as multiples of the mean weight, for clip='absolute'."},
    )
    pareto_smoothing: bool = field(
        default=False,
        metadata={
            "help": "replace the largest weights by the expected order statistics of a generalised Pareto fit "
            "(PSIS); the fitted tail shape k is reported (k > 0.7: the weights are too heavy-tailed to trust)."
        },
    )
    self_normalize: bool = field(
        default=True,
        metadata={"help": "rescale the weights of scored rows to mean 1 (keeps the loss on SFT's scale)."},
    )
    skipped_weight: float = field(
        default=0.0,
        metadata={"help": "weight given to rows that were not scored (overlong rows under overlong='skip')."},
    )
    weight_column: str = field(
        default="weight",
        metadata={"help": "name of the weight column (WeightedSFTTrainer reads 'weight' by default)."},
    )

    def __post_init__(self) -> None:
        _check_choice("formula", self.formula, FORMULAS)
        _check_choice("normalization", self.normalization, NORMALIZATIONS)
        _check_choice("clip", self.clip, CLIP_MODES)
        if not self.temperature > 0:
            raise ValueError(f"temperature must be positive, got {self.temperature}")
        low, high = _pair("clip_quantiles", self.clip_quantiles)
        if not 0.0 <= low < high <= 1.0:
            raise ValueError(f"clip_quantiles must satisfy 0 <= low < high <= 1, got {self.clip_quantiles}")
        low, high = _pair("clip_weights", self.clip_weights)
        if not 0.0 < low < high:
            raise ValueError(f"clip_weights must satisfy 0 < low < high, got {self.clip_weights}")

    @property
    def roles(self) -> tuple[str, ...]:
        """The model roles this formula reads."""
        return tuple(role for role in ROLES if role in FORMULAS[self.formula])


@dataclass
class ScoreConfig(WeightConfig):
    """`WeightConfig` plus how the three models are run over the dataset."""

    tokens_per_batch: int = field(
        default=8192,
        metadata={"help": "token budget of a padded batch (rows x longest row); batches are length-sorted."},
    )
    chunk_tokens: int | None = field(
        default=None,
        metadata={
            "help": "padded tokens per cached chunk, the unit of resumption and of work split across processes "
            "(an interrupted run loses at most one chunk per process); default: 1/128 of each model's tokens, "
            "between 1,024 and 2,097,152."
        },
    )
    chunk_rows: int | None = field(
        default=None, metadata={"help": "also cap each cached chunk at this many rows (default: no cap)."}
    )
    cache_dir: str | None = field(
        default=None,
        metadata={"help": "where per-model scores are cached (default: $KINFOLK_CACHE or ~/.cache/kinfolk/scores)."},
    )
    use_cache: bool = field(
        default=True, metadata={"help": "cache per-model scores on disk so an interrupted run resumes."}
    )
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = field(
        default="auto",
        metadata={
            "help": "weights dtype; 'auto' is bfloat16 (with autocast) on a GPU that supports it, else float32."
        },
    )
    attn_implementation: str | None = field(
        default=None, metadata={"help": "passed to from_pretrained (e.g. 'sdpa', 'flash_attention_2')."}
    )
    max_length: int | None = field(
        default=None,
        metadata={"help": "longest sequence a model may score (default: each model's max_position_embeddings)."},
    )
    overlong: Literal["error", "skip"] = field(
        default="error",
        metadata={
            "help": "rows longer than max_length: 'error' names them and stops; 'skip' leaves them unscored "
            "(NaN log-probs, weight = skipped_weight) and counts them."
        },
    )
    completion_only_loss: bool | None = field(
        default=None,
        metadata={"help": "as in SFTConfig; None scores only the completion of prompt/completion data."},
    )
    assistant_only_loss: bool | None = field(
        default=None,
        metadata={"help": "as in SFTConfig; None scores only the assistant turns of 'messages' data."},
    )
    dataset_text_field: str = field(default="text", metadata={"help": "as in SFTConfig."})
    select_fraction: float | None = field(
        default=None,
        metadata={
            "help": "keep only this fraction of rows, those with the highest IFD = ppl(y|x)/ppl(y), before "
            "weighting (the paper combines 0.05/0.10/0.15); rows with IFD >= 1 are dropped first."
        },
    )
    ifd_model: Literal["large_base", "small_base", "reference"] = field(
        default="small_base",
        metadata={"help": "model that computes IFD: 'small_base' is Superfiltering, 'large_base' the original IFD."},
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_choice("overlong", self.overlong, ("error", "skip"))
        _check_choice("ifd_model", self.ifd_model, ROLES)
        for name in ("tokens_per_batch", "chunk_tokens", "chunk_rows", "max_length"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value}")
        if self.select_fraction is not None and not 0.0 < self.select_fraction <= 1.0:
            raise ValueError(f"select_fraction must be in (0, 1], got {self.select_fraction}")

    def weight_config(self) -> WeightConfig:
        names = {f.name for f in dataclasses.fields(WeightConfig)}
        return WeightConfig(**{name: getattr(self, name) for name in names})


ConfigT = TypeVar("ConfigT", bound=WeightConfig)


def resolve_config(cls: type[ConfigT], config: WeightConfig | None, options: dict[str, Any]) -> ConfigT:
    """`config` (or the defaults) as a `cls`, with keyword `options` applied; unknown names are refused."""
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(options) - names)
    if unknown:
        raise TypeError(f"unknown {cls.__name__} option(s) {unknown}; valid options: {sorted(names)}")
    values = {} if config is None else {n: getattr(config, n) for n in names if hasattr(config, n)}
    values.update(options)
    return cls(**values)


def _check_choice(name: str, value: Any, choices) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {list(choices)}, got {value!r}")


def _pair(name: str, values: list[float]) -> tuple[float, float]:
    if len(values) != 2:
        raise ValueError(f"{name} needs exactly two numbers (low high), got {values}")
    return float(values[0]), float(values[1])
