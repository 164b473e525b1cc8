import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from kinfolk.testing import (
    ARCHITECTURES,
    build_model,
    build_tokenizer,
    conversational_dataset,
    conversational_prompt_completion_dataset,
    prompt_completion_dataset,
    text_dataset,
)


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_each_architecture_loads_from_disk_and_generates(tiny_kit, tiny_tokenizer, architecture):
    family = tiny_kit.family(architecture)
    small = AutoModelForCausalLM.from_pretrained(family["small_base"])
    large = AutoModelForCausalLM.from_pretrained(family["large_base"])
    assert small.config.model_type == architecture
    assert large.config.num_hidden_layers > small.config.num_hidden_layers
    assert large.config.hidden_size > small.config.hidden_size
    assert small.config.vocab_size == large.config.vocab_size == len(tiny_tokenizer)
    ids = tiny_tokenizer("What is 2 + 3?", return_tensors="pt")["input_ids"]
    with torch.inference_mode():
        out = small.generate(ids, max_new_tokens=5, do_sample=False, min_new_tokens=5)
        logits = large(ids).logits
    assert out.shape == (1, ids.shape[1] + 5)
    assert torch.isfinite(logits).all()
    # random but wide weights: the next-token distribution is far from uniform
    probs = logits[0, -1].softmax(-1)
    assert probs.max() > 5 / len(tiny_tokenizer)


def test_instruct_sibling_differs_from_its_base(tiny_kit):
    family = tiny_kit.family("qwen2")
    base = AutoModelForCausalLM.from_pretrained(family["small_base"]).state_dict()
    instruct = AutoModelForCausalLM.from_pretrained(family["small_instruct"]).state_dict()
    assert base.keys() == instruct.keys()
    assert all(base[k].shape == instruct[k].shape for k in base)
    assert any(not torch.equal(base[k], instruct[k]) for k in base)


def test_sharded_directory_loads_same_weights(tiny_kit):
    single = tiny_kit.model_dir("mistral", "large")
    sharded = tiny_kit.model_dir("mistral", "large", sharded=True)
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    a = AutoModelForCausalLM.from_pretrained(single).state_dict()
    b = AutoModelForCausalLM.from_pretrained(sharded).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_models_are_seeded():
    a = build_model("qwen3", "small", seed=3).state_dict()
    b = build_model("qwen3", "small", seed=3).state_dict()
    c = build_model("qwen3", "small", seed=4).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(a[k], c[k]) for k in a)


def test_tokenizer_round_trips_and_saves(tmp_path):
    tokenizer = build_tokenizer()
    text = "def f(x):\n    return x * 2  # ünïcödé ✓"
    assert tokenizer.decode(tokenizer(text)["input_ids"]) == text
    assert build_tokenizer().get_vocab() == tokenizer.get_vocab()  # deterministic merges
    tokenizer.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    assert loaded.eos_token == "<|im_end|>" and loaded.pad_token == "<|pad|>"
    assert loaded.pad_token_id != loaded.eos_token_id


def test_chat_template_marks_assistant_tokens():
    tokenizer = build_tokenizer()
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "olleh"}]
    out = tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
    trained = [t for t, m in zip(out["input_ids"], out["assistant_masks"]) if m]
    assert tokenizer.decode(trained) == "olleh<|im_end|>"
    prompt = tokenizer.apply_chat_template(messages[:1], tokenize=False, add_generation_prompt=True)
    full = tokenizer.apply_chat_template(messages, tokenize=False)
    assert full.startswith(prompt)


def test_datasets_have_trl_shapes():
    assert text_dataset(4).column_names == ["text"]
    pc = prompt_completion_dataset(4)
    assert pc.column_names == ["prompt", "completion"] and len(pc) == 4
    row = conversational_dataset(4)[0]["messages"]
    assert [m["role"] for m in row] == ["system", "user", "assistant"]
    cpc = conversational_prompt_completion_dataset(4)[0]
    assert cpc["prompt"][0]["role"] == "user" and cpc["completion"][0]["role"] == "assistant"
    # answers are checkable: additions are right
    additions = [
        example for example in prompt_completion_dataset(50, seed=1) if example["prompt"].startswith("What is")
    ]
    assert len(additions) >= 5
    for example in additions:
        a, b = example["prompt"][8:-1].split(" + ")
        assert int(example["completion"]) == int(a) + int(b)
