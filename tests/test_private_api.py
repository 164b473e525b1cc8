"""The private names of torch, transformers, TRL, PEFT and lm-eval that kinfolk overrides, calls or reads.

A library renames or reshapes its private methods without notice. This test lists every private name kinfolk
relies on, with the parameters its override or call uses, and runs in every cell of the tested version window
(`make test-compat`, docs/compatibility.md, which says for each why no public hook does its job): after an
upgrade it fails naming the private name that went or changed, and where kinfolk relies on it, instead of a
trainer failing deep inside a run. A name that differs inside the window gets a switch in `kinfolk.compat`.

A method must exist with exactly the parameter names listed (an override must accept what the library passes, and
a call passes what the library takes); an attribute must exist on the class or be assigned in the source of a
class of its MRO (instance attributes set in `__init__`).
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import re
from dataclasses import dataclass

import pytest


@dataclass(frozen=True)
class PrivateUse:
    """One private name: `owner` is a dotted path (module, then attributes) to the class or module holding it;
    `parameters` the parameter names of a callable in order (None for a plain attribute); `user` where kinfolk
    relies on it."""

    owner: str
    name: str
    parameters: tuple[str, ...] | None
    user: str

    @property
    def label(self) -> str:
        return f"{self.owner}.{self.name}"


SFT_TRAINER = "trl.trainer.sft_trainer.SFTTrainer"
TRAINER = "transformers.trainer.Trainer"
BASE_TUNER = "peft.tuners.tuners_utils.BaseTuner"
BASE_TUNER_LAYER = "peft.tuners.tuners_utils.BaseTunerLayer"

PRIVATE_USES = (
    # TRL
    PrivateUse(SFT_TRAINER, "_prepare_dataset",
               ("self", "dataset", "processing_class", "args", "packing", "formatting_func", "dataset_name"),
               "trainers/weighted_sft_trainer.py (override, super() call), trainers/layer_distillation_trainer.py, "
               "kinfolk/tokens.py (called on a stand-in trainer)"),
    PrivateUse(SFT_TRAINER, "_set_signature_columns_if_needed", ("self",),
               "trainers/weighted_sft_trainer.py (override, super() call)"),
    PrivateUse(SFT_TRAINER, "_prepare_inputs", ("self", "inputs"), "trainers/weighted_sft_trainer.py (Output-KL)"),
    PrivateUse(SFT_TRAINER, "_signature_columns", None, "trainers/weighted_sft_trainer.py (extended by the "
               "weight columns)"),
    PrivateUse(SFT_TRAINER, "_skip_prepare_dataset", None, "trainers/weighted_sft_trainer.py (refuses vision data)"),
    PrivateUse(SFT_TRAINER, "_metrics", None, "trainers/weighted_sft_trainer.py, trainers/layer_distillation_trainer"
               ".py (logged terms)"),
    PrivateUse("trl.trainer.sft_config.SFTConfig", "_VALID_DICT_FIELDS", None,
               "trainers/layer_distillation_config.py (extended by teacher_model_init_kwargs)"),
    # transformers
    PrivateUse(TRAINER, "_save_checkpoint", ("self", "model", "trial"), "trainers/atomic_checkpoints.py (override)"),
    PrivateUse(TRAINER, "_get_output_dir", ("self", "trial"),
               "trainers/atomic_checkpoints.py (called, and shadowed by a staging directory while saving)"),
    PrivateUse(TRAINER, "_save", ("self", "output_dir", "state_dict"),
               "trainers/layer_distillation_trainer.py (override, super() call)"),
    PrivateUse(TRAINER, "_get_train_sampler", ("self", "train_dataset"),
               "trainers/layer_distillation_trainer.py (override, super() call)"),
    # PEFT
    PrivateUse("peft.tuners._buffer_dict", "BufferDict", ("buffers", "persistent"),
               "plugins/atlas/layer.py (the atlas buffers)"),
    PrivateUse(BASE_TUNER, "_create_and_replace",
               ("self", "peft_config", "adapter_name", "target", "target_name", "parent", "current_key",
                "parameter_name"), "plugins/atlas/model.py (override)"),
    PrivateUse(BASE_TUNER, "_prepare_adapter_config", ("self", "peft_config", "model_config"),
               "plugins/atlas/model.py (override)"),
    PrivateUse(BASE_TUNER, "_cast_adapter_dtype", ("self", "adapter_name", "autocast_adapter_dtype"),
               "plugins/atlas/model.py (override, super() call)"),
    PrivateUse(BASE_TUNER, "_remap_adapter_state_dict_for_load", ("model", "config", "adapter_name", "state_dict"),
               "plugins/atlas/model.py (classmethod override, super() call)"),
    PrivateUse(BASE_TUNER, "_replace_module", ("self", "parent", "child_name", "new_module", "child"),
               "plugins/atlas/model.py"),
    PrivateUse(BASE_TUNER_LAYER, "_move_adapter_to_device_of_base_layer", ("self", "adapter_name", "device"),
               "plugins/atlas/layer.py (override, super() call)"),
    PrivateUse(BASE_TUNER_LAYER, "_disable_adapters", None, "plugins/atlas/layer.py, plugins/atlas/fit.py (the "
               "frozen model's passes)"),
    PrivateUse(BASE_TUNER_LAYER, "_active_adapter", None, "plugins/atlas/layer.py"),
    # torch
    PrivateUse("torch.distributed.fsdp.FSDPModule", "_get_fsdp_state", ("self",), "kinfolk/sharding.py"),
    PrivateUse("torch.distributed.fsdp._fully_shard._fsdp_state.FSDPState", "_lazy_init", ("self",),
               "kinfolk/sharding.py"),
    # lm-eval
    PrivateUse("lm_eval._cli", "HarnessCLI", (), "kinfolk/commands/eval.py"),
    PrivateUse("lm_eval._cli.HarnessCLI", "_parser", None, "kinfolk/commands/eval.py (usage errors as kinfolk's)"),
)  # fmt: skip


def resolve(path: str) -> object:
    """The object at a dotted path: the longest importable module prefix, then attributes."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attribute in parts[cut:]:
            found = getattr(found, attribute)
        return found
    raise ModuleNotFoundError(path)


def library_version(use: PrivateUse) -> str:
    top = use.owner.split(".")[0]
    return f"{top} {importlib.import_module(top).__version__}"


def assigned_in_source(owner: type, name: str) -> bool:
    """Whether a class of `owner`'s MRO assigns `self.<name>` (an instance attribute made in a method)."""
    assignment = re.compile(rf"\bself\.{re.escape(name)}\s*(:[^=\n]*)?=[^=]")
    for cls in inspect.getmro(owner):
        try:
            source = inspect.getsource(cls)
        except (OSError, TypeError):
            continue
        if assignment.search(source):
            return True
    return False


@pytest.mark.parametrize("use", PRIVATE_USES, ids=lambda use: use.label)
def test_private_name_kinfolk_relies_on_is_unchanged(use):
    where = f"{library_version(use)}: {use.label}, which kinfolk relies on in {use.user}"
    owner = resolve(use.owner)
    present = hasattr(owner, use.name) or (inspect.isclass(owner) and assigned_in_source(owner, use.name))
    assert present, f"{where}, is gone; adapt kinfolk (kinfolk.compat) to it"
    if use.parameters is not None:
        found = tuple(inspect.signature(getattr(owner, use.name)).parameters)
        assert found == use.parameters, (
            f"{where}, changed its parameters from {use.parameters} to {found}; adapt kinfolk (kinfolk.compat) to it"
        )


def test_sft_tokenize_stands_in_for_every_trainer_attribute_trl_prepare_dataset_reads():
    """`kinfolk.tokens.sft_tokenize` calls TRL's `SFTTrainer._prepare_dataset` on a stand-in trainer, which must
    carry every `self.` attribute that method reads."""
    from trl import SFTTrainer

    from kinfolk.tokens import _TrainerStandIn

    read = set(re.findall(r"\bself\.(\w+)", inspect.getsource(SFTTrainer._prepare_dataset)))
    stood_in = {field.name for field in dataclasses.fields(_TrainerStandIn)}
    assert read <= stood_in, (
        f"trl's SFTTrainer._prepare_dataset now reads self.{sorted(read - stood_in)}, which kinfolk.tokens."
        "_TrainerStandIn (sft_tokenize) does not provide"
    )


def test_the_check_names_a_missing_or_changed_private_name():
    missing = PrivateUse(SFT_TRAINER, "_no_such_private_method", ("self",), "nowhere")
    with pytest.raises(AssertionError, match=r"trl \S+: .*SFTTrainer\._no_such_private_method, .* is gone"):
        test_private_name_kinfolk_relies_on_is_unchanged(missing)
    changed = dataclasses.replace(PRIVATE_USES[0], parameters=("self", "dataset"))
    with pytest.raises(AssertionError, match=r"SFTTrainer\._prepare_dataset, .* changed its parameters"):
        test_private_name_kinfolk_relies_on_is_unchanged(changed)
