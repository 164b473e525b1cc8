"""ADAPT merges on real checkpoints (`make test-real`; skipped when `make real-models` has not run).

SmolLM2 (Llama, 30 layers, tied head) and Gemma 3 270M (18 layers, sliding / full attention `layer_types`, tied
head): a boomerang student (every other layer and the last), the teacher rebuilt from it by patching every
block, and a half-patched intermediate size that unties the head, all loaded and generating.
"""

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from kinfolk.plugins.adapt import LayerMap, merge
from kinfolk.tensors import TensorReader

pytestmark = pytest.mark.real

PROMPT = "Q: What is the capital of Italy?\nA: Rome\nQ: What is the capital of France?\nA:"


def greedy(directory, tokenizer, tokens=6):
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    inputs = tokenizer(PROMPT, return_tensors="pt")
    with torch.no_grad():
        output = model.generate(**inputs, max_new_tokens=tokens, do_sample=False)
    return output[0, inputs["input_ids"].shape[1] :].tolist()


@pytest.mark.parametrize("name", ["smollm2-135m-instruct", "gemma-3-270m"])
def test_boomerang_family_of_a_real_checkpoint(real_model_dir, tmp_path, name):
    teacher = real_model_dir(name)
    config = AutoConfig.from_pretrained(teacher)
    layers = config.get_text_config().num_hidden_layers
    student = merge({"op": "init-student", "teacher": str(teacher), "layers": {"every": 2, "last": 1}},
                    tmp_path / "student", progress=False)  # fmt: skip
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

    half = merge({"op": "patch", "teacher": str(teacher), "student": str(student), "order": "back-to-front",
                  "num_patched": layer_map.num_student_layers // 2}, tmp_path / "half", progress=False)  # fmt: skip
    half_config = AutoConfig.from_pretrained(half)
    assert half_config.tie_word_embeddings is False  # student embeddings, teacher head
    assert layer_map.num_student_layers < half_config.get_text_config().num_hidden_layers < layers

    tokenizer = AutoTokenizer.from_pretrained(teacher)
    assert greedy(whole, tokenizer) == greedy(teacher, tokenizer)
    for directory in (student, half):
        assert len(greedy(directory, tokenizer, tokens=4)) == 4


def test_distillation_loss_on_a_real_pair_matches_full_logits(real_model_dir, tmp_path):
    from test_distillation_trainer import first_batch, make_args, reference_loss  # the tiny-model reference

    from kinfolk.testing import prompt_completion_dataset
    from kinfolk.trainers import DistillationTrainer

    teacher = real_model_dir("smollm2-135m-instruct")
    student = merge({"op": "init-student", "teacher": str(teacher), "layers": {"every": 2, "last": 1}},
                    tmp_path / "student", progress=False)  # fmt: skip
    trainer = DistillationTrainer(
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
