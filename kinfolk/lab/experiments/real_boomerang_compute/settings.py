"""What the real-boomerang version 3 plan fixes before its runs: version 2's teacher, student, rows and distillation
budget; the cross-entropy student's budget at equal training FLOPs (`kinfolk.lab.methods.compute`: SmolLM2-135M-
Instruct multiplies 134,479,872 weights per token, its 16-layer student 84,934,656, so 80 distillation steps cost
what 122 cross-entropy steps cost); the budget ladder climbed until validation stops improving; and each seed's
draw of 64 measured and 16 validation rows per source.

>>> settings = RealBoomerangComputeSettings()
>>> settings.steps, settings.equal_flops_steps, settings.rows_for(settings.equal_flops_steps)
(80, 122, (244, 244))
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kinfolk.lab.methods.two_phase import TwoPhaseBudget
from kinfolk.lab.protocol.settings import RealModelSettings

# Each arm's loss and the settings' field that fixes its budget (None: the ladder's converged budget).
ARMS = {
    "distilled": ("distilled", "steps"),
    "ce-only/equal-steps": ("ce-only", "steps"),
    "ce-only/equal-flops": ("ce-only", "equal_flops_steps"),
    "ce-only/converged": ("ce-only", None),
}
LOSS_WEIGHTS = {"distilled": {}, "ce-only": {"kl_weight": 0.0, "cosine_weight": 0.0}}


@dataclass(frozen=True)
class RealBoomerangComputeSettings(TwoPhaseBudget, RealModelSettings):  # its `model` is the teacher
    layers: dict = field(
        default_factory=lambda: {"every": 2, "last": 1}, metadata={"help": "the student's layer selection"}
    )
    steps: int = field(default=80, metadata={"help": "steps of the distilled student (version 2's budget)"})
    equal_flops_steps: int = field(
        default=122,
        metadata={"help": "steps of the cross-entropy student at the distilled student's training FLOPs "
                  "(kinfolk.lab.methods.compute.equal_flops_steps of the teacher's and student's weights)"},
    )  # fmt: skip
    ce_budgets: list[int] = field(
        default_factory=lambda: [80, 122, 160, 240, 320],
        metadata={"help": "the cross-entropy student's budget ladder, climbed until validation stops improving"},
    )
    stop_tolerance: float = field(
        default=0.01,
        metadata={"help": "nats of validation log perplexity a budget must gain over the best so far to go on"},
    )
    batch_size: int = field(default=4, metadata={"help": "rows per optimiser step"})
    max_length: int = field(default=128, metadata={"help": "tokens per training row"})
    learning_rate: float = field(default=3e-4, metadata={"help": "ADAPT's learning rate (every trained arm)"})
    pretraining_fraction: float = field(default=0.5, metadata={"help": "share of the steps on pre-training text"})
    patched_blocks: int = field(
        default=16, metadata={"help": "M, the student's blocks (sizes k = 0..M); a run with another M is refused"}
    )
    measured_rows_per_source: int = field(
        default=64, metadata={"help": "held-out rows per source each seed measures its curves on (protocol: >= 64)"}
    )
    validation_rows_per_source: int = field(
        default=16, metadata={"help": "held-out rows per source, apart from the measured ones, the ladder stops on"}
    )
    measured_length: int = field(default=64, metadata={"help": "tokens per measured or validation row"})
    chat_prompts: int = field(
        default=264, metadata={"help": "instructions the teacher answers (train + held-out pool: 81 held out)"}
    )
    answer_tokens: int = field(default=48, metadata={"help": "greedy tokens per teacher answer"})
    seeds: list[int] = field(
        default_factory=lambda: [0, 1, 2, 3, 4],
        metadata={"help": "units: each draws its measured and validation rows, its training rows and their order"},
    )
    work: str = field(
        default="runs/real-boomerang-compute", metadata={"help": "students, caches and logs (not committed)"}
    )
    records: str = field(
        default="docs/results/real-boomerang-compute-units",
        metadata={"help": "each seed's rows, ladder and per-size numbers (committed)"},
    )
