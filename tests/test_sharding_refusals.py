"""A loss that reads weights outside a module's forward is refused under DeepSpeed ZeRO-3 (Output-KL under FSDP too)
with one line naming the option and the launcher, as the GPU checks found those paths failing (docs/distributed.md);
a measurement gathers the head it reads instead.

Here a trainer's ZeRO stage is set through `kinfolk.sharding.zero_stage`, and a ZeRO-3 partitioned parameter is
marked as DeepSpeed marks it (`ds_id`); ZeRO-3 itself runs in tests/test_zero3.py (two CPU processes) and tests/gpu.
"""

import contextlib
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from distil_helpers import make_args
from peft import LoraConfig, get_peft_model
from sft_helpers import weighted_data, weighted_trainer
from two_process_helpers import environment

from kinfolk import sharding
from kinfolk.errors import InputError
from kinfolk.plugins.atlas import AtlasConfig, fit_atlas
from kinfolk.plugins.atlas.layer import AtlasLinear
from kinfolk.testing import build_model, prompt_completion_dataset, text_dataset
from kinfolk.trainers import LayerDistillationTrainer


def launched_trainer(zero_stage: int | None = None, fsdp: bool = False) -> SimpleNamespace:
    plugin = None if zero_stage is None else SimpleNamespace(zero_stage=zero_stage)
    return SimpleNamespace(
        accelerator=SimpleNamespace(state=SimpleNamespace(deepspeed_plugin=plugin)), is_fsdp_enabled=fsdp
    )


@pytest.fixture
def under_zero3(monkeypatch):
    monkeypatch.setattr(sharding, "zero_stage", lambda trainer: 3)


@pytest.mark.parametrize(
    ("zero_stage", "fsdp", "under_fsdp", "launcher"),
    [
        (None, False, True, None),
        (2, False, True, None),
        (3, False, False, "DeepSpeed ZeRO-3"),
        (None, True, False, None),
        (None, True, True, "FSDP"),
    ],
)
def test_refused_only_under_the_launchers_named(zero_stage, fsdp, under_fsdp, launcher):
    def call():
        sharding.refuse_under_sharding(
            launched_trainer(zero_stage, fsdp), "an option", "a reason", under_fsdp=under_fsdp
        )

    if launcher is None:
        call()
        return
    with pytest.raises(InputError) as refused:
        call()
    assert str(refused.value) == f"an option is not supported under {launcher}: a reason (use DDP or DeepSpeed ZeRO-2)"


def test_zero_stage_reads_the_deepspeed_plugin():
    assert [sharding.zero_stage(launched_trainer(stage)) for stage in (None, 2, 3)] == [None, 2, 3]
    assert sharding.zero_stage(object()) is None


def test_a_measurement_gathers_only_the_partitioned_tensors(monkeypatch):
    """TRL's gather reads `ds_status`, which a head's frozen copy (a plain tensor) lacks: the GPU check's failure."""
    import trl.trainer.utils

    gathered = []

    @contextlib.contextmanager
    def gather(*parameters):
        gathered.append(parameters)
        yield

    monkeypatch.setattr(trl.trainer.utils, "maybe_gather_lm_head_ctx", gather)
    plain, partitioned = torch.zeros(2), torch.nn.Parameter(torch.zeros(0))
    with sharding.gathered_for_reading(None, plain):
        pass
    assert gathered == []
    partitioned.ds_id = 0  # as DeepSpeed marks each parameter it partitions
    with sharding.gathered_for_reading(plain, None, partitioned):
        pass
    assert gathered == [(partitioned,)]


def test_under_zero3_divergences_use_the_stand_in_kernel(monkeypatch):
    """TRL's kernel gathers both heads itself under ZeRO-3 and fails on a plain tensor; the stand-in computes the same
    numbers (tests/test_divergence.py) from the heads kinfolk gathered."""
    import transformers.integrations.deepspeed as hf_deepspeed

    from kinfolk.compat import trl as trl_compat

    monkeypatch.setattr(hf_deepspeed, "is_deepspeed_zero3_enabled", lambda: True)
    assert trl_compat.chunked_divergence_function() is trl_compat.divergence_from_logits


def test_distillation_kl_is_refused_under_zero3_and_the_cosine_term_is_not(
    distil_pair, tmp_path, tiny_tokenizer, under_zero3
):
    teacher, student, _ = distil_pair

    def trainer(kl_weight: float) -> LayerDistillationTrainer:
        return LayerDistillationTrainer(
            model=student,
            teacher_model=teacher,
            args=make_args(tmp_path, kl_weight=kl_weight, cosine_weight=1.0),
            train_dataset=prompt_completion_dataset(4),
            processing_class=tiny_tokenizer,
        )

    with pytest.raises(InputError, match=r"^kl_weight > 0 is not supported under DeepSpeed ZeRO-3"):
        trainer(0.5)
    assert trainer(0.0).cosine_weight == 1.0


# Run in a fresh process: ZeRO-3 arguments set process-wide state (transformers' DeepSpeed config, accelerate's
# environment) that later tests of a worker would inherit.
REFUSED_BEFORE_LOADING = """
import sys
from pathlib import Path

import trl
from distil_helpers import make_args

from kinfolk.errors import InputError
from kinfolk.trainers import LayerDistillationTrainer


def loaded(*args, **kwargs):
    raise AssertionError("the student was loaded")


trl.SFTTrainer.__init__ = loaded
zero3 = {"zero_optimization": {"stage": 3}, "train_micro_batch_size_per_gpu": "auto", "train_batch_size": "auto"}
args = make_args(Path(sys.argv[1]), kl_weight=1.0, deepspeed=zero3)
try:
    LayerDistillationTrainer(model="no-such-student", teacher_model="no-such-teacher", args=args)
except InputError as error:
    print(error)
"""


def test_distillation_kl_is_refused_from_zero3_arguments_before_the_student_loads(tmp_path):
    """With no trainer yet, the ZeRO-3 arguments alone (transformers' own flag, not a stand-in) refuse the KL term:
    before the student (and its layer map, here missing) is read."""
    command = [sys.executable, "-c", REFUSED_BEFORE_LOADING, str(tmp_path)]
    variables = environment(Path(__file__).parent, variables={"DS_ACCELERATOR": "cpu"})
    done = subprocess.run(command, env=variables, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1].startswith("kl_weight > 0 is not supported under DeepSpeed ZeRO-3: ")


def test_output_kl_is_refused_under_zero3(tiny_tokenizer, tmp_path, under_zero3):
    with pytest.raises(InputError, match=r"^output_kl_coef > 0 is not supported under DeepSpeed ZeRO-3"):
        weighted_trainer(
            tiny_tokenizer,
            weighted_data(4),
            tmp_path,
            peft_config=LoraConfig(r=2, target_modules=["q_proj"]),
            retained_dataset=text_dataset(3),
            output_kl_coef=1.0,
        )


@pytest.fixture
def atlas_model(tiny_tokenizer):
    torch.manual_seed(0)
    return get_peft_model(build_model("llama", tokenizer=tiny_tokenizer), AtlasConfig(r=2, num_regions=2))


def test_an_atlas_adapter_partitioned_by_zero3_refuses_its_forward(atlas_model):
    inputs = {"input_ids": torch.tensor([[1, 2, 3]])}
    atlas_model(**inputs)  # not partitioned: runs
    layer = next(module for module in atlas_model.modules() if isinstance(module, AtlasLinear))
    layer.atlas_A["default"].ds_id = 0
    with pytest.raises(InputError, match="not supported under DeepSpeed ZeRO-3"):
        atlas_model(**inputs)


def test_fit_atlas_refuses_a_model_loaded_partitioned(atlas_model, tiny_tokenizer):
    next(atlas_model.base_model.model.model.embed_tokens.parameters()).ds_id = 0
    with pytest.raises(InputError, match="not supported under DeepSpeed ZeRO-3"):
        fit_atlas(atlas_model, text_dataset(4), tiny_tokenizer, progress=False)
