"""ADAPT merges on real checkpoints (`make test-real`; skipped when `make real-models` has not run).

SmolLM2 (Llama, 30 layers, tied head) and Gemma 3 270M (18 layers, sliding / full attention `layer_types`, tied
head): a boomerang student (every other layer and the last), the teacher rebuilt from it by patching every
block, and a back-to-front half patch (student embeddings, teacher head): still tied while the student keeps the
teacher's embeddings, untied once they moved, checked against the loaded weights, all loaded and generating.

Qwen2.5-Coder-0.5B (Qwen2, 24 layers, untied head, ~2.5 GB in fp32): a 12-layer ADAPT student, its whole family
from `kinfolk merge patch --all` (the full size is the teacher, tensor for tensor; a middle size generates), and
a weight delta carried from one student variant to another, checked tensor by tensor.
"""

import json
import shutil

import pytest
import torch
from adapt_helpers import distilled_copy
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from kinfolk.commands import main
from kinfolk.plugins.adapt import LayerMap, merge
from kinfolk.tensors import TensorReader
from kinfolk.testing.resources import measure

pytestmark = pytest.mark.real

QWEN = "qwen2.5-coder-0.5b-instruct"
PROMPT = "Q: What is the capital of Italy?\nA: Rome\nQ: What is the capital of France?\nA:"


def greedy(directory, tokenizer, tokens=6):
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    inputs = tokenizer(PROMPT, return_tensors="pt")
    with torch.no_grad():
        output = model.generate(**inputs, max_new_tokens=tokens, do_sample=False)
    return output[0, inputs["input_ids"].shape[1] :].tolist()


def embeddings_and_head(directory):
    """The input embedding matrix and the LM head's own matrix as transformers loads them (the head is None where
    the model ties it to the embeddings: one tensor serves both)."""
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    embeddings, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    return embeddings.detach(), None if head is embeddings else head.detach()


@pytest.fixture(scope="module", params=["smollm2-135m-instruct", "gemma-3-270m"])
def boomerang_student(request, real_model_dir, tmp_path_factory):
    """(teacher, boomerang student: every other layer and the last, its embeddings the teacher's) of a real
    checkpoint with a tied head; the student is made once for the tests of its model."""
    teacher = real_model_dir(request.param)
    student = merge({"op": "init-student", "teacher": str(teacher), "layers": {"every": 2, "last": 1}},
                    tmp_path_factory.mktemp(request.param) / "student", progress=False)  # fmt: skip
    return teacher, student


def half_patch(teacher, student, out):
    """The back-to-front half patch: the student's first half (its embeddings) and the teacher's last blocks (its
    head)."""
    num_patched = LayerMap.load(student).num_student_layers // 2
    return merge({"op": "patch", "teacher": str(teacher), "student": str(student), "order": "back-to-front",
                  "num_patched": num_patched}, out, progress=False)  # fmt: skip


def test_boomerang_family_of_a_real_checkpoint(boomerang_student, tmp_path):
    teacher, student = boomerang_student
    config = AutoConfig.from_pretrained(teacher)
    layers = config.get_text_config().num_hidden_layers
    layer_map = LayerMap.load(student)
    assert layer_map.kept_layers == sorted({*range(0, layers, 2), layers - 1})
    student_config = AutoConfig.from_pretrained(student)
    if getattr(config, "layer_types", None):
        assert student_config.layer_types == [config.layer_types[i] for i in layer_map.kept_layers]

    whole = merge({"op": "patch", "teacher": str(teacher), "student": str(student),
                   "num_patched": layer_map.num_student_layers}, tmp_path / "whole", progress=False)  # fmt: skip
    rebuilt, original = TensorReader(whole), TensorReader(teacher)
    assert rebuilt.names() == original.names()
    for tensor in original.names():
        assert torch.equal(rebuilt.get(tensor), original.get(tensor)), tensor

    tokenizer = AutoTokenizer.from_pretrained(teacher)
    assert greedy(whole, tokenizer) == greedy(teacher, tokenizer)
    assert len(greedy(student, tokenizer, tokens=4)) == 4


def test_half_patch_keeps_the_head_tied_when_the_student_kept_the_teachers_embeddings(boomerang_student, tmp_path):
    teacher, student = boomerang_student
    teacher_embeddings, teacher_head = embeddings_and_head(teacher)
    student_embeddings, student_head = embeddings_and_head(student)
    assert teacher_head is None and student_head is None  # both tied
    assert torch.equal(student_embeddings, teacher_embeddings)  # an init student keeps the teacher's embeddings

    half = half_patch(teacher, student, tmp_path / "half")
    half_config = AutoConfig.from_pretrained(half)
    teacher_layers = AutoConfig.from_pretrained(teacher).get_text_config().num_hidden_layers
    assert LayerMap.load(student).num_student_layers < half_config.get_text_config().num_hidden_layers < teacher_layers
    assert half_config.tie_word_embeddings is True
    assert "lm_head.weight" not in TensorReader(half).names()  # no untied copy of the head is written
    half_embeddings, half_head = embeddings_and_head(half)
    assert half_head is None
    assert torch.equal(half_embeddings, teacher_embeddings)  # so the tied head is the teacher's head, exactly
    assert len(greedy(half, AutoTokenizer.from_pretrained(teacher), tokens=4)) == 4


def test_half_patch_unties_the_head_when_the_students_embeddings_moved(boomerang_student, tmp_path):
    teacher, student = boomerang_student
    tokenizer = AutoTokenizer.from_pretrained(teacher)
    moved = distilled_copy(student, tmp_path / "moved", tokenizer, seed=7)  # every weight moved, embeddings too
    teacher_embeddings, teacher_head = embeddings_and_head(teacher)
    moved_embeddings, moved_head = embeddings_and_head(moved)
    assert teacher_head is None and moved_head is None  # both tied
    assert not torch.equal(moved_embeddings, teacher_embeddings)

    half = half_patch(teacher, moved, tmp_path / "half")
    assert AutoConfig.from_pretrained(half).tie_word_embeddings is False
    assert "lm_head.weight" in TensorReader(half).names()
    half_embeddings, half_head = embeddings_and_head(half)
    assert half_head is not None
    assert torch.equal(half_embeddings, moved_embeddings)  # the front (embeddings) is the student's
    assert torch.equal(half_head, teacher_embeddings)  # the back (head) is the teacher's tied matrix
    assert len(greedy(half, tokenizer, tokens=4)) == 4


def test_distillation_loss_on_a_real_pair_matches_full_logits(real_model_dir, tmp_path):
    from distil_helpers import first_batch, make_args, reference_loss  # the tiny-model reference

    from kinfolk.testing import prompt_completion_dataset
    from kinfolk.trainers import LayerDistillationTrainer

    teacher = real_model_dir("smollm2-135m-instruct")
    student = merge({"op": "init-student", "teacher": str(teacher), "layers": {"every": 2, "last": 1}},
                    tmp_path / "student", progress=False)  # fmt: skip
    trainer = LayerDistillationTrainer(
        model=str(student), teacher_model=str(teacher), args=make_args(tmp_path, kl_weight=0.1, temperature=2.0,
                                                                        per_device_train_batch_size=2),
        train_dataset=prompt_completion_dataset(4), processing_class=AutoTokenizer.from_pretrained(teacher),
    )  # fmt: skip
    inputs = first_batch(trainer)
    loss = trainer.compute_loss(trainer.model, dict(inputs))
    layer_map = LayerMap.load(student)
    pair = {"student": student, "teacher": teacher}
    expected = reference_loss(pair, inputs, 0.1, trainer.cosine_weight, 2.0, layer_map.aligned_teacher_layers)
    torch.testing.assert_close(loss, expected, rtol=1e-4, atol=1e-4)
    assert trainer._metrics["train"]["distill/kl"][-1] > 0.01  # an initialised student is not yet the teacher


def same_checkpoint(left, right):
    """Tensor for tensor equal, one tensor in memory at a time (the Qwen checkpoints are 2 GB each)."""
    left, right = TensorReader(left), TensorReader(right)
    assert left.names() == right.names()
    for tensor in right.names():
        assert torch.equal(left.get(tensor), right.get(tensor)), tensor


@pytest.fixture(scope="module")
def qwen_student(real_model_dir, tmp_path_factory):
    """(teacher, 12-layer student, scratch folder); the ~30 GB written under it is removed afterwards rather
    than left to pytest's retention of the last three runs."""
    teacher = real_model_dir(QWEN)
    root = tmp_path_factory.mktemp("qwen")
    with measure("adapt_init_student", model=QWEN) as usage:
        student = merge({"op": "init-student", "teacher": str(teacher), "layers": {"every": 2}},
                        root / "student", progress=False)  # fmt: skip
    print(usage.summary())
    yield teacher, student, root
    shutil.rmtree(root, ignore_errors=True)


def test_qwen_family_from_patch_all_rebuilds_the_untied_teacher(qwen_student):
    teacher, student, root = qwen_student
    layer_map = LayerMap.load(student)
    assert layer_map.kept_layers == list(range(0, 24, 2))
    assert layer_map.blocks == tuple((i, i + 2) for i in range(0, 24, 2))
    assert AutoConfig.from_pretrained(student).tie_word_embeddings is False
    assert "lm_head.weight" in TensorReader(student).names()  # the untied head is copied, not re-tied

    config = root / "patch.yaml"
    config.write_text(json.dumps({"teacher": str(teacher), "student": str(student)}))  # JSON is YAML
    with measure("adapt_patch_all", model=QWEN) as usage:
        assert main(["merge", "patch", str(config), "--out", str(root / "family"), "--all", "--no-progress"]) == 0
    print(usage.summary())
    family = json.loads((root / "family" / "family.json").read_text())
    sizes = [model["dir"] for model in family["models"]]
    assert sizes == [f"k{k:02d}" for k in range(13)]
    for k, size in enumerate(sizes):  # each patched block puts back its two teacher layers
        assert AutoConfig.from_pretrained(root / "family" / size).num_hidden_layers == 12 + k
    same_checkpoint(root / "family" / "k12", teacher)

    tokenizer = AutoTokenizer.from_pretrained(teacher)
    with measure("adapt_generate_patched", model=QWEN) as usage:
        assert greedy(root / "family" / "k12", tokenizer) == greedy(teacher, tokenizer)
        assert len(greedy(root / "family" / "k06", tokenizer, tokens=4)) == 4
    print(usage.summary())
    shutil.rmtree(root / "family")


def test_qwen_weight_delta_transfers_between_two_variants(qwen_student):
    """θ_variant_init + (θ_distilled − θ_init), tensor by tensor; the two students are seeded perturbations of the
    real init (standing in for a distilled student and for the init of a sibling model's student)."""
    teacher, student, root = qwen_student
    tokenizer = AutoTokenizer.from_pretrained(teacher)
    distilled = distilled_copy(student, root / "distilled", tokenizer, seed=7)
    variant_init = distilled_copy(student, root / "variant-init", tokenizer, seed=11)
    with measure("adapt_delta_transfer", model=QWEN) as usage:
        delta = merge({"op": "delta", "init": str(student), "distilled": str(distilled)}, root / "delta",
                      progress=False)  # fmt: skip
        out = merge({"op": "apply-delta", "init": str(variant_init), "delta": str(delta)}, root / "transferred",
                    progress=False)  # fmt: skip
    print(usage.summary())
    result, variant = TensorReader(out), TensorReader(variant_init)
    base, moved = TensorReader(student), TensorReader(distilled)
    assert result.names() == variant.names() == base.names()
    for tensor in base.names():
        expected = variant.get(tensor) + (moved.get(tensor) - base.get(tensor))  # the float32 delta, then the sum
        assert torch.equal(result.get(tensor), expected), tensor
    assert LayerMap.load(out) == LayerMap.load(student)
    assert AutoConfig.from_pretrained(out).num_hidden_layers == 12
