"""Defaults of kinfolk's training configs that TRL's do not give: what a CPU user means, and no deprecation warning
about a field the user never set.

Training defaults a CPU user means: no accelerator → train on the CPU in fp32, unless bf16 is asked for.

TRL's configs default to `bf16=True` (when fp16 is not set), and transformers then refuses a machine without a bf16
GPU ("You need to assign use_cpu"); with `use_cpu=True` alone the run trains under CPU bf16 autocast, slow and not
what the saved fp32 weights compute, and accelerate's autocast wrapper stays on the in-memory model after training.
kinfolk's configs (`WeightedSFTConfig`, `LayerDistillationConfig`) call `apply_device_defaults` before TRL's own
`__post_init__` (through `apply_config_defaults`): an explicit `bf16`, `fp16` or `use_cpu` is kept; only what was left unset is chosen, and the choice
is said once per process tree, in one line (logged as a warning).

TRL's `SFTConfig` sets `gradient_checkpointing=True` by default, the name transformers 5 deprecated for
`activation_checkpointing`, so every config built warned "`gradient_checkpointing` is deprecated" about a value
nobody typed; `carry_checkpointing_alias` moves the value to the new name first (an explicit
`activation_checkpointing` wins, as in transformers).

>>> from types import SimpleNamespace
>>> config = SimpleNamespace(use_cpu=True, bf16=None, fp16=False)
>>> device_defaults(config, accelerator=True, bf16_accelerator=True)
'bf16 was not set and training runs on the CPU: training in fp32 (for CPU bf16 autocast: --bf16 true on kinfolk sft and distil)'
>>> config.bf16
False
"""

from __future__ import annotations

import logging
import os
from typing import Any

from kinfolk.hints import suggest

logger = logging.getLogger(__name__)
# named with the verbs that take it: the note is also logged by trainings the lab and compare start, which do not
BF16_HINT = suggest("--bf16 true", "sft", "distil")

# Set once the choice has been said: by the `kinfolk sft` process and inherited by the processes it launches.
SAID_ENV = "KINFOLK_DEVICE_DEFAULTS_SAID"


def device_defaults(config: Any, accelerator: bool, bf16_accelerator: bool) -> str | None:
    """Fill `config.use_cpu` and an unset `config.bf16` for the hardware; returns what was chosen, or None."""
    notes = []
    if not config.use_cpu and not accelerator:
        config.use_cpu = True
        notes.append("no GPU or other accelerator found: training on the CPU (use_cpu)")
    if config.bf16 is None and not config.fp16 and (config.use_cpu or not bf16_accelerator):
        config.bf16 = False
        if config.use_cpu:
            notes.append("bf16 was not set and training runs on the CPU: training in fp32 (for CPU bf16 autocast: "
                         f"{BF16_HINT} on kinfolk sft and distil)")  # fmt: skip
        else:
            notes.append("bf16 was not set and the accelerator has no bf16: training in fp32")
    return "; ".join(notes) or None


def apply_device_defaults(config: Any) -> None:
    """`device_defaults` for this machine, saying the choice once (see the module docstring)."""
    import torch
    from transformers.utils import is_torch_bf16_gpu_available

    note = device_defaults(
        config, accelerator=torch.accelerator.is_available(), bf16_accelerator=is_torch_bf16_gpu_available()
    )
    if note and not os.environ.get(SAID_ENV):
        os.environ[SAID_ENV] = "1"
        logger.warning(note)


def carry_checkpointing_alias(config: Any) -> None:
    """Put `gradient_checkpointing` under its new name `activation_checkpointing` when only the old one is set."""
    if getattr(config, "activation_checkpointing", False) is None and config.gradient_checkpointing is not None:
        config.activation_checkpointing = config.gradient_checkpointing


def apply_config_defaults(config: Any) -> None:
    """Every default of this module, before TRL's `__post_init__`."""
    carry_checkpointing_alias(config)
    apply_device_defaults(config)
