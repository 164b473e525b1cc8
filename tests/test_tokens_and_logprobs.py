import pytest
import torch
from transformers import AutoModelForCausalLM
from trl import SFTConfig, SFTTrainer

from kinfolk.logprobs import label_log_probs, pad_right, sequence_log_probs
from kinfolk.testing import (
    conversational_dataset,
    conversational_prompt_completion_dataset,
    prompt_completion_dataset,
    text_dataset,
)
from kinfolk.tokens import (
    DatasetFormatError,
    dataset_type,
    overlong_rows,
    response_bytes,
    response_text,
    sft_tokenize,
)

DATASETS = {
    "prompt-completion": prompt_completion_dataset,
    "conversational": conversational_dataset,
    "language modeling": text_dataset,
    "conversational prompt-completion": conversational_prompt_completion_dataset,
}


# assistant_only_loss exists only for conversational datasets (TRL refuses it otherwise)
CASES = [(kind, False) for kind in sorted(DATASETS)] + [
    ("conversational", True),
    ("conversational prompt-completion", True),
]


@pytest.mark.parametrize(("kind", "assistant_only"), CASES)
def test_sft_tokenize_equals_the_trainers_own_dataset(tiny_kit, tiny_tokenizer, tmp_path, kind, assistant_only):
    dataset = DATASETS[kind](6)
    args = SFTConfig(
        output_dir=str(tmp_path),
        report_to="none",
        use_cpu=True,
        bf16=False,
        max_length=None,
        assistant_only_loss=assistant_only,
    )
    model = AutoModelForCausalLM.from_pretrained(tiny_kit.model_dir("llama"))
    trainer = SFTTrainer(model=model, args=args, train_dataset=dataset, processing_class=tiny_tokenizer)
    ours = sft_tokenize(dataset, tiny_tokenizer, args)
    theirs = trainer.train_dataset
    assert ours["input_ids"] == theirs["input_ids"]
    assert ours["labels"] == theirs["labels"]


def test_dataset_type_errors_name_columns():
    assert dataset_type(["prompt", "completion", "weight"]) == "prompt-completion"
    assert dataset_type(["messages"]) == "conversational"
    with pytest.raises(DatasetFormatError, match=r"columns present: \['question'\]"):
        dataset_type(["question"])


def test_conversational_without_chat_template_is_refused(tiny_tokenizer):
    tokenizer = tiny_tokenizer.__class__.from_pretrained(tiny_tokenizer.name_or_path)
    tokenizer.chat_template = None
    with pytest.raises(DatasetFormatError, match="no chat template"):
        sft_tokenize(conversational_dataset(2), tokenizer)


def test_response_text_and_bytes():
    assert response_text({"prompt": "p", "completion": " 19"}) == " 19"
    assert response_bytes({"prompt": "p", "completion": "é"}) == 2
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "ab"}]
    assert response_text({"messages": messages}) == "ab"
    assert response_text({"prompt": [messages[0]], "completion": [messages[1]]}) == "ab"


def test_overlong_rows(tiny_tokenizer):
    tokens = sft_tokenize(prompt_completion_dataset(5), tiny_tokenizer)
    lengths = [len(ids) for ids in tokens["input_ids"]]
    limit = sorted(lengths)[2]
    assert overlong_rows(tokens, limit) == [i for i, n in enumerate(lengths) if n > limit]


@pytest.mark.parametrize("architecture", ["llama", "gemma2", "qwen3"])
def test_label_log_probs_match_full_softmax_and_padding(tiny_kit, tiny_tokenizer, architecture):
    model = AutoModelForCausalLM.from_pretrained(tiny_kit.model_dir(architecture))
    tokens = sft_tokenize(prompt_completion_dataset(4), tiny_tokenizer)
    batch = pad_right(tokens["input_ids"], tokens["labels"], tiny_tokenizer.pad_token_id)
    with torch.inference_mode():
        totals, counts = sequence_log_probs(model, **batch)
    for row, (ids, labels) in enumerate(zip(tokens["input_ids"], tokens["labels"])):
        ids_t = torch.tensor([ids])
        with torch.inference_mode():
            logits = model(input_ids=ids_t).logits[0, :-1].double()  # independent: full logits, one example
        targets = torch.tensor(labels[1:])
        keep = targets != -100
        expected = torch.log_softmax(logits, -1)[keep, targets[keep]].sum()
        assert counts[row] == keep.sum()
        assert totals[row].item() == pytest.approx(expected.item(), abs=2e-4)


def test_label_log_probs_are_differentiable(tiny_kit):
    model = AutoModelForCausalLM.from_pretrained(tiny_kit.model_dir("qwen2"))
    ids = torch.tensor([[3, 4, 5, 6, 7]])
    log_probs, mask = label_log_probs(model, ids, None, ids)
    (-log_probs.sum()).backward()
    assert model.model.embed_tokens.weight.grad.abs().sum() > 0
    assert mask.all()
    # generation is untouched by the fused head
    assert model.generate(ids, max_new_tokens=2, do_sample=False).shape == (1, 7)


def test_default_args_need_no_device_and_train_on_the_completion_only(tiny_tokenizer):
    dataset = prompt_completion_dataset(2, seed=5)
    tokens = sft_tokenize(dataset, tiny_tokenizer)
    assert tokens["completion"] == dataset["completion"]  # the user's text comes back untouched
    row = tokens[0]
    trained = [t for t, label in zip(row["input_ids"], row["labels"]) if label != -100]
    assert tiny_tokenizer.decode(trained) == row["completion"] + tiny_tokenizer.eos_token
