"""LayerDistillationTrainer against a hand-written loss on full logits, SFTTrainer identities and its two-phase order."""

import pytest
import torch
from adapt_helpers import distilled_copy, init_student
from distil_helpers import first_batch, make_args, reference_loss
from transformers import AutoModelForCausalLM, TrainerCallback
from trl import SFTConfig, SFTTrainer

from kinfolk.plugins.adapt import LAYER_MAP_FILE, LayerMap, merge
from kinfolk.testing import prompt_completion_dataset, text_dataset
from kinfolk.trainers import LayerDistillationTrainer, layer_distillation_trainer


@pytest.fixture(scope="module")
def pairs(tiny_kit, tmp_path_factory):
    """Per architecture: a 4-layer teacher and a 2-layer student (init-student, then perturbed so that the KL and
    cosine terms are far from zero)."""
    root = tmp_path_factory.mktemp("distill")
    tokenizer = tiny_kit.tokenizer()
    result = {}
    for architecture in ("llama", "gemma2"):
        teacher = tiny_kit.model_dir(architecture, "large")
        init = init_student(teacher, root / f"{architecture}-init", layers=[0, 1])
        student = distilled_copy(init, root / f"{architecture}-student", tokenizer, seed=3, scale=0.05)
        result[architecture] = {"teacher": teacher, "student": student}
    return result


def make_trainer(pair, tmp_path, tokenizer, pretraining=None, **overrides):
    return LayerDistillationTrainer(
        model=str(pair["student"]),
        teacher_model=str(pair["teacher"]),
        args=make_args(tmp_path, **overrides),
        train_dataset=prompt_completion_dataset(8),
        pretraining_dataset=pretraining,
        processing_class=tokenizer,
    )


@pytest.mark.parametrize("architecture", ["llama", "gemma2"])
def test_loss_matches_full_logit_reference(pairs, tmp_path, tiny_tokenizer, architecture):
    pair = pairs[architecture]
    trainer = make_trainer(pair, tmp_path, tiny_tokenizer, kl_weight=0.5, temperature=2.0)
    assert trainer.cosine_weight == pytest.approx(10 / 3)  # ADAPT default 10 / (M + 1), M = 2
    inputs = first_batch(trainer)
    loss = trainer.compute_loss(trainer.model, dict(inputs))
    expected = reference_loss(pair, inputs, 0.5, 10 / 3, 2.0, aligned=[0, 3])  # blocks [0, 1) and [1, 4)
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-5)
    assert trainer._metrics["train"]["distill/kl"][-1] > 0


def test_zero_weights_reproduce_sft_trainer_without_loading_the_teacher(pairs, tmp_path, tiny_tokenizer, monkeypatch):
    pair = pairs["llama"]
    loaded = []
    real_load = layer_distillation_trainer.create_model_from_path
    monkeypatch.setattr(
        layer_distillation_trainer, "create_model_from_path", lambda *a, **k: loaded.append(a[0]) or real_load(*a, **k)
    )
    trainer = make_trainer(pair, tmp_path, tiny_tokenizer, kl_weight=0.0, cosine_weight=0.0)
    assert trainer.teacher_model is None and loaded == []  # both terms off: the teacher is never loaded
    inputs = first_batch(trainer)
    sft = SFTTrainer(
        model=str(pair["student"]),
        args=SFTConfig(output_dir=str(tmp_path / "sft"), use_cpu=True, bf16=False, report_to=[]),
        train_dataset=prompt_completion_dataset(8),
        processing_class=tiny_tokenizer,
    )
    distilled_loss = trainer.compute_loss(trainer.model, dict(inputs), num_items_in_batch=torch.tensor(37))
    sft_loss = sft.compute_loss(sft.model, dict(inputs), num_items_in_batch=torch.tensor(37))
    assert torch.equal(distilled_loss, sft_loss)


def test_zero_weights_train_the_student_the_teacher_forward_would(pairs, tmp_path, tiny_tokenizer):
    """Skipping the unused teacher changes the cost only: the same student, bit for bit, as when both terms are
    computed and enter the loss times zero (what a cross-entropy arm did before the teacher was skipped)."""

    def trained(with_teacher: bool) -> dict[str, torch.Tensor]:
        # with the teacher: built with a cosine term, whose weight is then set to 0 (the terms enter times zero)
        trainer = make_trainer(pairs["gemma2"], tmp_path / str(with_teacher), tiny_tokenizer,
                               pretraining=text_dataset(8, seed=1), max_steps=4, kl_weight=0.0,
                               cosine_weight=1.0 if with_teacher else 0.0)  # fmt: skip
        teacher_calls = []
        if with_teacher:
            trainer.teacher_model.register_forward_hook(lambda *_: teacher_calls.append(1))
            trainer.cosine_weight = 0.0
        trainer.train()
        assert len(teacher_calls) == (4 if with_teacher else 0)
        assert ("distill/kl" in trainer.state.log_history[0]) == with_teacher
        return {name: value.clone() for name, value in trainer.model.state_dict().items()}

    skipped, computed = trained(False), trained(True)
    start = AutoModelForCausalLM.from_pretrained(pairs["gemma2"]["student"]).state_dict()
    assert any(not torch.equal(skipped[name], start[name]) for name in start)  # it trained
    assert skipped.keys() == computed.keys()
    assert all(torch.equal(skipped[name], computed[name]) for name in skipped)


def test_student_identical_to_teacher_has_no_distillation_loss(tiny_kit, tmp_path, tiny_tokenizer):
    teacher = tiny_kit.model_dir("qwen3", "large")
    student = merge({"op": "init-student", "teacher": str(teacher), "layers": {"every": 1}}, tmp_path / "same",
                    progress=False)  # fmt: skip
    trainer = make_trainer({"teacher": teacher, "student": student}, tmp_path, tiny_tokenizer, kl_weight=1.0)
    inputs = first_batch(trainer)
    trainer.compute_loss(trainer.model, dict(inputs))
    assert trainer._metrics["train"]["distill/kl"][-1] == pytest.approx(0, abs=1e-6)
    assert trainer._metrics["train"]["distill/cosine_distance"][-1] == pytest.approx(0, abs=1e-6)


@pytest.mark.parametrize("reentrant", [False, True])
def test_gradients_are_the_same_with_gradient_checkpointing(pairs, tmp_path, tiny_tokenizer, reentrant):
    def gradients(checkpointing):
        trainer = make_trainer(pairs["gemma2"], tmp_path, tiny_tokenizer, gradient_checkpointing=checkpointing,
                               gradient_checkpointing_kwargs={"use_reentrant": reentrant})  # fmt: skip
        trainer.model.train()
        trainer.compute_loss(trainer.model, dict(first_batch(trainer))).backward()
        return {name: p.grad.clone() for name, p in trainer.model.named_parameters() if p.grad is not None}

    plain, checkpointed = gradients(False), gradients(True)
    assert sorted(plain) == sorted(checkpointed)
    assert any("layers.0." in name for name in plain)
    for name in plain:
        torch.testing.assert_close(checkpointed[name], plain[name], rtol=1e-4, atol=1e-6)


def test_two_phases_in_order_under_one_schedule(pairs, tmp_path, tiny_tokenizer):
    pair = pairs["llama"]
    trainer = make_trainer(pair, tmp_path, tiny_tokenizer, pretraining=text_dataset(8, seed=1), max_steps=4)
    assert trainer._phase_sizes == (8, 8)
    batches = list(trainer.get_train_dataloader())
    assert len(batches) == 4  # the whole run is one pass: 2 steps of each phase (pretraining_fraction 0.5)
    pretraining_rows = {tuple(row) for row in trainer.train_dataset.select(range(8))["input_ids"]}
    for position, batch in enumerate(batches):
        rows = {tuple(ids[mask.bool()].tolist()) for ids, mask in zip(batch["input_ids"], batch["attention_mask"])}
        in_phase_one = rows <= pretraining_rows
        assert in_phase_one == (position < 2), position
        trained = batch["labels"] != -100
        # phase 1 trains on every real token, phase 2 on the responses only
        assert torch.equal(trained, batch["attention_mask"].bool()) == in_phase_one
    teacher_before = {k: v.clone() for k, v in trainer.teacher_model.state_dict().items()}
    student_before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    trainer.train()
    rates = [row["learning_rate"] for row in trainer.state.log_history if "learning_rate" in row]
    expected = [3e-4 * 0.5 * (1 + torch.cos(torch.tensor(torch.pi * step / 4))).item() for step in range(4)]
    assert rates == pytest.approx(expected, rel=1e-5)  # one cosine over both phases, no restart at the boundary
    assert not trainer.teacher_model.training
    assert all(not p.requires_grad for p in trainer.teacher_model.parameters())
    for name, value in trainer.teacher_model.state_dict().items():
        assert torch.equal(value, teacher_before[name]), name
    assert any(not torch.equal(v, student_before[k]) for k, v in trainer.model.state_dict().items())
    trainer.save_model()
    assert LayerMap.load(tmp_path / "out") == LayerMap.load(pair["student"])


def _row_ids(batch) -> list[tuple[int, ...]]:
    return [tuple(ids[mask.bool()].tolist()) for ids, mask in zip(batch["input_ids"], batch["attention_mask"])]


def test_phases_split_the_steps_by_pretraining_fraction(pairs, tmp_path, tiny_tokenizer):
    """1 of 4 steps of pre-training (fraction 0.25): 4 of its 8 rows; then 3 SFT steps pass over the 8 SFT rows
    once and half again, every row of a pass drawn once."""
    trainer = make_trainer(pairs["llama"], tmp_path, tiny_tokenizer, pretraining=text_dataset(8, seed=1),
                           max_steps=4, pretraining_fraction=0.25)  # fmt: skip
    pretraining_rows = {tuple(row) for row in trainer.train_dataset.select(range(8))["input_ids"]}
    sft_rows = [tuple(row) for row in trainer.train_dataset.select(range(8, 16))["input_ids"]]
    batches = [_row_ids(batch) for batch in trainer.get_train_dataloader()]
    assert len(batches) == 4
    assert set(batches[0]) <= pretraining_rows and len(set(batches[0])) == 4
    drawn = [row for batch in batches[1:] for row in batch]
    assert sorted(drawn[:8]) == sorted(sft_rows)  # a full pass first
    assert len(set(drawn[8:])) == 4 and set(drawn[8:]) <= set(sft_rows)
    with pytest.raises(ValueError, match="set max_steps"):
        make_trainer(pairs["llama"], tmp_path, tiny_tokenizer, pretraining=text_dataset(8, seed=1))
    with pytest.raises(ValueError, match="pretraining_fraction"):
        make_args(tmp_path, pretraining_fraction=1.5)


def _response_positions(batch, dataset, tokenizer) -> torch.Tensor:
    """(batch, length − 1): True where the next token is a response token (or the EOS after it), found from the
    rows' own prompt and completion by tokenising them apart, not from the batch's labels."""
    prompt_length = {}
    for row in dataset:
        full = tokenizer(row["prompt"] + row["completion"])["input_ids"] + [tokenizer.eos_token_id]
        prompt_length[tuple(full)] = len(tokenizer(row["prompt"])["input_ids"])
    mask = torch.zeros_like(batch["input_ids"][:, 1:], dtype=torch.bool)
    for index, ids in enumerate(_row_ids(batch)):
        mask[index, prompt_length[ids] - 1 : len(ids) - 1] = True
    return mask


@pytest.mark.parametrize("phase", ["pretraining", "sft"])
def test_each_phase_aligns_its_own_positions(pairs, tmp_path, tiny_tokenizer, phase):
    """CE, KL and block cosine against the full-logit reference: in phase 1 over every position of prompt /
    completion rows (their prompts included), in phase 2 over the response positions only."""
    pair = pairs["llama"]
    sft = prompt_completion_dataset(8)
    pretraining = prompt_completion_dataset(8, seed=5)
    trainer = LayerDistillationTrainer(
        model=str(pair["student"]),
        teacher_model=str(pair["teacher"]),
        args=make_args(tmp_path, max_steps=2, kl_weight=0.3),
        train_dataset=sft,
        pretraining_dataset=pretraining,
        processing_class=tiny_tokenizer,
    )
    trainer.model.train()
    batch = list(trainer.get_train_dataloader())[0 if phase == "pretraining" else 1]
    inputs = trainer._prepare_inputs(batch)
    if phase == "pretraining":
        mask = inputs["attention_mask"][:, 1:].bool()  # every real next token
    else:
        mask = _response_positions(inputs, sft, tiny_tokenizer)
        assert mask.sum() < inputs["attention_mask"][:, 1:].sum()  # the prompts are left out
    loss = trainer.compute_loss(trainer.model, dict(inputs))
    expected = reference_loss(pair, inputs, 0.3, 10 / 3, 1.0, aligned=[0, 3], mask=mask)
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-5)


class _StopAt(TrainerCallback):
    """Interrupts training after `step` optimizer steps, as a killed job would (after its last checkpoint)."""

    def __init__(self, step):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        control.should_training_stop = state.global_step >= self.step


def test_resuming_from_a_checkpoint_gives_the_uninterrupted_result(pairs, tmp_path, tiny_tokenizer):
    pair = pairs["llama"]

    def run(directory, stop=None, resume=None):
        trainer = make_trainer(pair, directory, tiny_tokenizer, pretraining=text_dataset(8, seed=1), max_steps=6,
                               per_device_train_batch_size=2, save_strategy="steps", save_steps=3)  # fmt: skip
        if stop:
            trainer.add_callback(_StopAt(stop))
        trainer.train(resume_from_checkpoint=resume)
        return trainer.model.state_dict()

    full = run(tmp_path / "full")
    run(tmp_path / "part", stop=3)  # phase 1 takes 4 steps: the job is interrupted inside it
    checkpoint = tmp_path / "part" / "out" / "checkpoint-3"
    assert LayerMap.load(checkpoint) == LayerMap.load(pair["student"])
    resumed = run(tmp_path / "part", resume=str(checkpoint))
    for name, value in full.items():
        torch.testing.assert_close(resumed[name], value, rtol=1e-5, atol=1e-6)


def test_missing_or_unfitting_layer_map_is_refused(pairs, tiny_kit, tmp_path, tiny_tokenizer):
    pair = pairs["llama"]
    model = AutoModelForCausalLM.from_pretrained(pair["student"])
    model.name_or_path = ""  # built in memory: no directory to find a map in
    with pytest.raises(ValueError, match="no layer map"):
        LayerDistillationTrainer(model=model, teacher_model=str(pair["teacher"]), args=make_args(tmp_path),
                            train_dataset=prompt_completion_dataset(4), processing_class=tiny_tokenizer)  # fmt: skip
    for weights in ({}, {"kl_weight": 0.0, "cosine_weight": 0.0}):  # a teacher never loaded is checked too
        with pytest.raises(ValueError, match="does not fit a 2-layer student and a 2-layer teacher"):
            LayerDistillationTrainer(model=str(pair["student"]), teacher_model=str(tiny_kit.model_dir("llama", "small")),
                                args=make_args(tmp_path, **weights), train_dataset=prompt_completion_dataset(4),
                                processing_class=tiny_tokenizer)  # fmt: skip


def test_checkpoints_are_staged_and_published_whole_with_the_layer_map(pairs, tmp_path, tiny_tokenizer, monkeypatch):
    """Each checkpoint-N (layer map included) is written aside and appears with one rename (AtomicCheckpointsMixin),
    so a distillation killed while saving never leaves a half-written checkpoint for resumption to pick."""
    from kinfolk.trainers import atomic_checkpoints

    published = []

    def recording_publish(staging, destination):
        published.append((sorted(path.name for path in staging.iterdir()), destination.name))
        return real_publish(staging, destination)

    real_publish = atomic_checkpoints.publish
    monkeypatch.setattr(atomic_checkpoints, "publish", recording_publish)
    trainer = make_trainer(pairs["llama"], tmp_path, tiny_tokenizer, max_steps=4, per_device_train_batch_size=2,
                           save_strategy="steps", save_steps=2)  # fmt: skip
    trainer.train()
    assert [destination for _, destination in published] == ["checkpoint-2", "checkpoint-4"]
    assert all({LAYER_MAP_FILE, "trainer_state.json", "model.safetensors"} <= set(files) for files, _ in published)
    assert sorted(path.name for path in (tmp_path / "out").iterdir() if path.name.startswith(".")) == []
