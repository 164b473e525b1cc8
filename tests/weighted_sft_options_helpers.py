"""The weighted-SFT option registry behind the table in docs/atlantis.md, and its identity-and-doubling check.

"Honoured" is shown by training, as a user trains, in two ways:
- identity: with every weight 1 the logged losses and the parameters after 2 steps equal `SFTTrainer`'s with the same
  option (rtol 1e-6);
- doubling: the loss is linear in the weights (the `token` reduction's D does not depend on them), so one SGD step
  with w = 2 on half the rows moves the parameters by the w ≡ 1 step plus the step of those rows alone (w = 1 on
  them, 0 on the rest): their contribution doubled, nothing else changed (rtol 1e-5, no gradient clipping).

Used by tests/test_weighted_sft_options.py, the 2-process job tests/weighted_sft_options_ddp_job.py and the GPU
checks in tests/gpu/scale_checks.py. `python tests/weighted_sft_options_helpers.py` prints the docs table.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest
from accelerate.parallelism_config import ParallelismConfig
from sft_helpers import assert_same_tensors, parameters, sft_trainer, weighted_trainer

from kinfolk.testing import conversational_dataset, prompt_completion_dataset

ROWS = 8
HALF = [2.0] * (ROWS // 2) + [1.0] * (ROWS // 2)
ALONE = [1.0] * (ROWS // 2) + [0.0] * (ROWS // 2)
ONE_SGD_STEP = {"optim": "sgd", "learning_rate": 0.5, "weight_decay": 0.0, "lr_scheduler_type": "constant",
                "max_grad_norm": 0.0, "per_device_train_batch_size": ROWS, "max_steps": 1}  # fmt: skip
TWO_STEPS = {"per_device_train_batch_size": ROWS // 2, "max_steps": 2, "max_grad_norm": 0.0}


@dataclass(frozen=True)
class Option:
    """One row of the table: the SFTConfig options, what kinfolk does with them, and why."""

    name: str
    status: str  # "honoured", "honoured (parts)", "refused", "GPU check"
    evidence: str
    options: dict = field(default_factory=dict)
    data: str = "prompt-completion"
    refusal: str = ""  # what the refusal's message must say (a regular expression)


OPTIONS = [
    Option("padding_free=True, no packing", "honoured", "identity and doubling",
           {"padding_free": True, "max_length": None}),
    Option("packing=True (bfd: padding-free)", "honoured", "identity and doubling",
           {"packing": True, "max_length": 48}),
    Option("packing_strategy='bfd_split'", "honoured", "identity and doubling",
           {"packing": True, "packing_strategy": "bfd_split", "max_length": 32}),
    Option("packing_strategy='wrapped'", "honoured", "identity and doubling (`token`, `self_normalized`); "
           "`sequence` refused: wrapped rows record no example starts",
           {"packing": True, "packing_strategy": "wrapped", "max_length": 32}),
    Option("packing_strategy='wrapped', padding_free=True", "honoured", "identity and doubling",
           {"packing": True, "packing_strategy": "wrapped", "padding_free": True, "max_length": 32}),
    Option("assistant_only_loss=True", "honoured", "identity and doubling (messages data)",
           {"assistant_only_loss": True}, "conversational"),
    Option("completion_only_loss=True", "honoured", "identity and doubling", {"completion_only_loss": True}),
    Option("completion_only_loss=False", "honoured", "identity and doubling (every token trained)",
           {"completion_only_loss": False}),
    Option("gradient_checkpointing=True", "honoured", "identity and doubling", {"gradient_checkpointing": True}),
    Option("gradient_checkpointing, use_reentrant=True", "honoured", "identity and doubling",
           {"gradient_checkpointing": True, "gradient_checkpointing_kwargs": {"use_reentrant": True}}),
    Option("torch_compile=True", "honoured", "identity and doubling with `torch_compile_backend='aot_eager'` "
           "(Dynamo + AOT autograd; inductor's code generation is the GPU check's)",
           {"torch_compile": True, "torch_compile_backend": "aot_eager"}),
    Option("average_tokens_across_devices=False", "honoured", "identity and doubling under 2 processes "
           "(tests/test_weighted_sft_options_ddp.py): each rank divides by its own D, as SFTTrainer by its own N",
           {"average_tokens_across_devices": False}),
    Option("use_liger_kernel=True", "honoured (parts)", "TRL keeps its fused LM head (liger's fused linear "
           "cross-entropy off), so the weighted log-probs are untouched: identity and doubling of one batch's loss "
           "and gradients; training needs liger-kernel (Triton, GPU): GPU check",
           {"use_liger_kernel": True}),
    Option("liger_kernel_config={'fused_linear_cross_entropy': True}", "refused",
           "by TRL: it replaces the forward that returns the per-token log-probs the weights multiply",
           {"use_liger_kernel": True, "liger_kernel_config": {"fused_linear_cross_entropy": True}},
           refusal="fused_linear_cross_entropy.*not supported"),
    Option("activation_offloading=True", "GPU check", "TRL's offloading only moves saved activations "
           "around the same `compute_loss`; TRL itself fails on CPU (it needs an accelerator device and its "
           "streams): GPU check", {"activation_offloading": True}),
    Option("parallelism_config, cp_size > 1", "refused", "context parallelism shards each sequence across ranks; "
           "the per-token weights are not sharded with it", {"parallelism_config": ParallelismConfig(cp_size=2)},
           refusal="context parallelism ..parallelism_config.*weights are not sharded"),
    Option("parallelism_config, sp_size > 1", "refused", "sequence parallelism (Ulysses/ALST) shards each "
           "sequence across ranks likewise", {"parallelism_config": ParallelismConfig(sp_size=2)},
           refusal="sequence parallelism ..parallelism_config.*weights are not sharded"),
    Option("label_smoothing_factor > 0", "refused", "TRL computes that loss from full logits, without the weights",
           {"label_smoothing_factor": 0.1}, refusal="label_smoothing_factor"),
    Option("loss_type='dft'", "refused", "it rescales each token by its own probability",
           {"loss_type": "dft"}, refusal="dft"),
    Option("dataset_kwargs={'skip_prepare_dataset': True}", "refused", "it skips the step that writes the "
           "weights on the tokens", {"dataset_kwargs": {"skip_prepare_dataset": True}},
           refusal="skip_prepare_dataset"),
]  # fmt: skip
BY_NAME = {option.name: option for option in OPTIONS}
TRAINED = [o.name for o in OPTIONS if o.status == "honoured" and "2 processes" not in o.evidence]


def rows(kind: str, weights: list[float] | None):
    data = conversational_dataset(ROWS) if kind == "conversational" else prompt_completion_dataset(ROWS)
    return data if weights is None else data.add_column("weight", weights)


def trained_update(tokenizer, directory: Path, option: Option, weights: list[float], **extra):
    trainer = weighted_trainer(tokenizer, rows(option.data, weights), directory, **{**option.options, **extra})
    before = parameters(trainer.model)
    trainer.train()
    after = parameters(trainer.model)
    loss = next(entry["loss"] for entry in trainer.state.log_history if "loss" in entry)
    return loss, {name: after[name] - before[name] for name in after}


def assert_identity_and_doubling(tokenizer, tmp_path: Path, option: Option, processes: int = 1) -> None:
    """The two checks of the module docstring; with `processes` ranks each takes its share of every batch."""
    two_steps = {**TWO_STEPS, "per_device_train_batch_size": ROWS // 2 // processes}
    one_step = {**ONE_SGD_STEP, "per_device_train_batch_size": ROWS // processes}
    ours = weighted_trainer(tokenizer, rows(option.data, [1.0] * ROWS), tmp_path / "w", **option.options, **two_steps)
    if option.options.get("packing"):  # the option is in force: rows were packed together
        assert len(ours.train_dataset) < ROWS
    ours.train()
    theirs = sft_trainer(tokenizer, rows(option.data, None), tmp_path / "s", **option.options, **two_steps)
    theirs.train()
    logged = [entry["loss"] for entry in theirs.state.log_history if "loss" in entry]
    assert len(logged) == 2
    assert [entry["loss"] for entry in ours.state.log_history if "loss" in entry] == pytest.approx(logged, rel=1e-6)
    assert_same_tensors(parameters(ours.model), parameters(theirs.model), rel=1e-6)

    one_loss, one = trained_update(tokenizer, tmp_path / "one", option, [1.0] * ROWS, **one_step)
    half_loss, half = trained_update(tokenizer, tmp_path / "half", option, HALF, **one_step)
    alone_loss, alone = trained_update(tokenizer, tmp_path / "alone", option, ALONE, **one_step)
    assert half_loss == pytest.approx(one_loss + alone_loss, rel=1e-5)
    assert_same_tensors(half, {name: one[name] + alone[name] for name in one}, rel=1e-5)
    assert max(float(update.abs().max()) for update in alone.values()) > 1e-4  # the doubled rows did move it


def markdown_table() -> str:
    lines = ["| option | kinfolk | evidence |", "|---|---|---|"]
    return "\n".join(lines + [f"| `{o.name}` | {o.status} | {o.evidence} |" for o in OPTIONS])


if __name__ == "__main__":
    print(markdown_table())
