"""Training compute, for comparisons at equal compute: FLOPs per step, the budget of equal FLOPs, and the budget at
which a student trained up a ladder of budgets stopped improving on validation.

A training step's FLOPs per token are about 2N for a forward and 4N for a backward of a model whose weights multiply
N times per token (every projection and MLP matrix, the output head included; the embedding is a lookup and the norms
are negligible): a cross-entropy step costs 6·N_student, a distillation step 6·N_student + 2·N_teacher (the teacher's
forward gives the KL targets and the block cosine's hidden states; nothing flows back through it). The
sequence-length terms of attention are left out.

>>> step_flops(1_000, 3_000, distilled=False), step_flops(1_000, 3_000, distilled=True)
(6000, 12000)
>>> equal_flops_steps(50, student=1_061_248, teacher=3_158_400)  # the lab's 4-layer student of a 12-layer teacher
100
"""

from __future__ import annotations

from typing import Any


def step_flops(student: int, teacher: int, distilled: bool) -> int:
    """Training FLOPs per token of one step: the student's forward and backward, plus the teacher's forward when
    distilling (`student`, `teacher`: their multiplying parameters)."""
    return 6 * student + (2 * teacher if distilled else 0)


def equal_flops_steps(distilled_steps: int, student: int, teacher: int) -> int:
    """The cross-entropy steps that cost what `distilled_steps` distillation steps cost (nearest whole step)."""
    ratio = step_flops(student, teacher, True) / step_flops(student, teacher, False)
    return round(distilled_steps * ratio)


def multiplying_parameters(config: Any, layers: int | None = None) -> int:
    """The weights a Llama-style causal LM of `config` (with `layers` layers, default the config's) multiplies per
    token: per layer the query and output projections (d x heads·head_dim), the key and value projections
    (d x kv_heads·head_dim), the gated MLP (3 d i), and the output head (d V), tied to the embedding or not."""
    d, heads = config.hidden_size, config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or d // heads
    kv = getattr(config, "num_key_value_heads", None) or heads
    per_layer = 2 * d * heads * head_dim + 2 * d * kv * head_dim + 3 * d * config.intermediate_size
    return (layers or config.num_hidden_layers) * per_layer + d * config.vocab_size


def converged_budget(
    ladder: list[tuple[int, float]], tolerance: float, higher_is_better: bool = True
) -> tuple[int, bool]:
    """From (budget, validation score) in climbing order, as far as it was climbed: the budget with the best score
    before the first that failed to improve on it by more than `tolerance`, and whether the ladder ran out first (the
    choice is then its last budget, on the grid's edge).

    >>> converged_budget([(50, 0.02), (100, 0.87), (150, 0.81)], 0.005)
    (100, False)
    >>> converged_budget([(50, 0.02), (100, 0.5)], 0.005)
    (100, True)
    >>> converged_budget([(80, 4.5), (122, 4.3), (160, 4.295)], 0.01, higher_is_better=False)  # a log perplexity
    (122, False)
    """
    sign = 1.0 if higher_is_better else -1.0
    best_steps, best = ladder[0]
    for steps, score in ladder[1:]:
        if sign * (score - best) <= tolerance:
            return best_steps, False
        best_steps, best = steps, score
    return best_steps, True
