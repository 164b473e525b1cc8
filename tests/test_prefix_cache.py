"""Measuring from the first changed layer (`kinfolk.prefix_cache`): the same KL and target score as the plain full
forward, on a Llama and on architectures with per-layer attention types (Gemma 2's sliding windows and soft-capped
head, Qwen 3), with layers below L really skipped, and never used where something below L can change."""

import pytest
import torch
from peft import LoraConfig, get_peft_model

from kinfolk.callbacks.target_metric import ValidationNLL
from kinfolk.divergence import DisabledAdapter, HiddenStateCache, token_divergence
from kinfolk.layout import decoder_layers
from kinfolk.prefix_cache import PrefixCache, first_changed_layer, shared_prefix_layers
from kinfolk.testing import build_model

LAYER = 2  # of the "large" tiny models' 4: the placement's layer


def adapted(architecture: str, layers=(LAYER,), seed: int = 0):
    """A PEFT model with a random (non-identity) LoRA on the attention output of `layers`."""
    torch.manual_seed(seed)
    lora = LoraConfig(r=4, target_modules=["o_proj"], layers_to_transform=list(layers), init_lora_weights=False)
    return get_peft_model(build_model(architecture, "large", seed=seed), lora).eval()


def padded_batches(lengths_per_batch, seed: int = 0):
    """Right-padded batches (pad id 0, labels -100 there), long enough to cross Gemma 2's 16-token window."""
    generator = torch.Generator().manual_seed(seed)
    batches = []
    for lengths in lengths_per_batch:
        width = max(lengths)
        ids = torch.randint(3, 384, (len(lengths), width), generator=generator)
        mask = (torch.arange(width)[None] < torch.tensor(lengths)[:, None]).long()
        ids = ids * mask
        labels = ids.masked_fill(mask == 0, -100)
        batches.append({"input_ids": ids, "attention_mask": mask, "labels": labels})
    return batches


BATCHES = [(40, 23, 31), (17, 36)]


def reference_kl(model, batch) -> float:
    """Pooled KL(adapter off ‖ adapter on) from full logits of plain forwards."""
    with torch.no_grad():
        current = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        with model.disable_adapter():
            frozen = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    log_p, log_q = torch.log_softmax(frozen[:, :-1].double(), -1), torch.log_softmax(current[:, :-1].double(), -1)
    scored = batch["labels"][:, 1:] != -100
    return float((log_p.exp() * (log_p - log_q)).sum(-1)[scored].mean())


def reference_score(model, batches) -> float:
    """Minus the mean NLL per label token, from full logits of plain forwards."""
    total = count = 0.0
    with torch.no_grad():
        for batch in batches:
            logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
            log_probs = torch.log_softmax(logits[:, :-1].double(), -1)
            labels = batch["labels"][:, 1:]
            scored = labels != -100
            total += float(log_probs.gather(-1, labels.clamp(min=0)[..., None])[..., 0][scored].sum())
            count += int(scored.sum())
    return total / count


class LayerCalls:
    """Counts the forwards of each decoder layer's MLP (run only when the layer itself runs)."""

    def __init__(self, model):
        self.calls = [0] * len(decoder_layers(model))
        self.hooks = [
            layer.mlp.register_forward_hook(lambda *_, index=index: self.count(index))
            for index, layer in enumerate(decoder_layers(model))
        ]

    def count(self, index):
        self.calls[index] += 1

    def reset(self):
        self.calls = [0] * len(self.calls)


@pytest.mark.parametrize("architecture", ["llama", "gemma2", "qwen3"])
def test_kl_and_target_score_equal_the_full_forward_and_lower_layers_do_not_run(architecture):
    model = adapted(architecture)
    batches = padded_batches(BATCHES)
    choice = PrefixCache.build(model, batches)
    assert choice.cache is not None and choice.cache.layer == LAYER, choice.reason
    frozen = HiddenStateCache.build(model, batches, disable_adapter=True)
    calls = LayerCalls(model)
    with torch.no_grad(), choice.cache.active(model) as in_use:
        assert in_use
        kls = [token_divergence(model, b["input_ids"], b["attention_mask"], b["labels"], frozen) for b in batches]
        live = [
            token_divergence(model, b["input_ids"], b["attention_mask"], b["labels"], DisabledAdapter())
            for b in batches
        ]
        score = ValidationNLL(batches)(model)
    # each layer below L skipped on all 2 × 3 forwards (cached KL, live KL on and off, score); L and above ran
    assert calls.calls == [0, 0, 8, 8]
    for batch, kl, live_kl in zip(batches, kls, live):
        expected = reference_kl(model, batch)
        assert expected > 1e-3
        assert float(kl.mean()) == pytest.approx(expected, rel=1e-5)
        assert float(live_kl.mean()) == pytest.approx(expected, rel=1e-5)
    assert score == pytest.approx(reference_score(model, batches), rel=1e-6)
    calls.reset()
    reference_score(model, batches)  # outside the context: the full forward again
    assert calls.calls == [2, 2, 2, 2]


def test_a_batch_padded_or_ordered_otherwise_runs_in_full():
    model = adapted("llama")
    batch = padded_batches([(30, 20)])[0]
    cache = PrefixCache.build(model, [batch]).cache
    reordered = {name: tensor.flip(0) for name, tensor in batch.items()}
    wider = {
        name: torch.nn.functional.pad(tensor, (0, 4), value=-100 if name == "labels" else 0)
        for name, tensor in batch.items()
    }
    calls = LayerCalls(model)
    with torch.no_grad(), cache.active(model):
        scores = {
            name: ValidationNLL([b])(model) for name, b in (("same", batch), ("flip", reordered), ("pad", wider))
        }
    assert calls.calls == [2, 2, 3, 3]  # the kept batch skipped layers 0 and 1; the other two ran them
    for name, other in (("flip", reordered), ("pad", wider)):
        assert scores[name] == pytest.approx(reference_score(model, [other]), rel=1e-6)
    assert scores["same"] == pytest.approx(reference_score(model, [batch]), rel=1e-6)


@pytest.mark.parametrize(
    ("setting", "reason"),
    [
        ("full", "model.embed_tokens.weight lies outside the decoder layers"),
        ("lora_everywhere", "layer 0 can change"),
        ("lower_layer_unfrozen", "layer 0 can change"),
        ("frozen_lower_adapter", "layer 1"),
    ],
)
def test_not_used_where_something_below_the_layer_can_change(setting, reason):
    if setting == "full":
        model = build_model("llama", "large")
        model.requires_grad_(True)
    elif setting == "lora_everywhere":
        model = adapted("llama", layers=range(4))
    elif setting == "lower_layer_unfrozen":
        model = adapted("llama")
        decoder_layers(model)[0].mlp.down_proj.weight.requires_grad_(True)
    else:  # an adapter at layer 1 that does not train still differs from the frozen model
        model = adapted("llama", layers=(1, LAYER))
        for name, parameter in model.named_parameters():
            if ".layers.1." in name:
                parameter.requires_grad_(False)
    choice = PrefixCache.build(model, padded_batches(BATCHES))
    assert reason in choice.reason or reason in choice.description
    if setting == "frozen_lower_adapter":
        assert choice.cache.layer == 1 and first_changed_layer(model).index == 1
    else:
        assert choice.cache is None


def test_a_layer_unfrozen_after_the_build_turns_it_off():
    model = adapted("llama")
    batches = padded_batches(BATCHES)
    cache = PrefixCache.build(model, batches).cache
    layer_one = decoder_layers(model)[1].mlp.down_proj.weight
    layer_one.requires_grad_(True)
    with torch.no_grad():
        layer_one.mul_(1.5)  # what training it would do: the kept states no longer hold
    calls = LayerCalls(model)
    with torch.no_grad(), cache.active(model) as in_use:
        score = ValidationNLL(batches)(model)
    assert not in_use and calls.calls == [2, 2, 2, 2]
    assert score == pytest.approx(reference_score(model, batches), rel=1e-6)


def test_states_kept_on_disk_give_the_same_score_and_are_removed_on_close(tmp_path):
    model = adapted("gemma2")
    batches = padded_batches(BATCHES)
    cache = PrefixCache.build(model, batches, directory=tmp_path / "prefix", memory_limit_bytes=0).cache
    assert sorted(path.suffix for path in (tmp_path / "prefix").iterdir()) == [".safetensors"] * 2
    with torch.no_grad(), cache.active(model):
        score = ValidationNLL(batches)(model)
    assert score == pytest.approx(reference_score(model, batches), rel=1e-6)
    cache.close()
    assert not (tmp_path / "prefix").exists() and len(cache) == 0


def test_built_in_train_mode_it_keeps_what_eval_mode_computes():
    torch.manual_seed(0)
    lora = LoraConfig(r=4, target_modules=["o_proj"], layers_to_transform=[LAYER], init_lora_weights=False)
    model = get_peft_model(build_model("llama", "large", attention_dropout=0.5), lora)
    batches = padded_batches(BATCHES)
    model.train()  # as at train start, where the callbacks build: dropout would scramble the kept states
    cache = PrefixCache.build(model, batches).cache
    assert model.training
    model.eval()
    with torch.no_grad(), cache.active(model):
        score = ValidationNLL(batches)(model)
    assert score == pytest.approx(reference_score(model, batches), rel=1e-6)


def test_shared_prefix_layers_stop_at_a_different_layer_type_and_start_at_a_different_rotary_table():
    gemma = build_model("gemma2", "large")  # layer types alternate sliding and full attention
    types = list(gemma.config.layer_types)
    swapped = build_model("gemma2", "large", layer_types=types[:2] + types[2:][::-1])  # same weights (same seed)
    assert swapped.config.layer_types[:2] == types[:2] and swapped.config.layer_types[2] != types[2]
    assert shared_prefix_layers(swapped, gemma) == 2 and shared_prefix_layers(gemma, gemma) == 4
    llama = build_model("llama", "large")
    other_rope = build_model("llama", "large", rope_parameters={"rope_type": "default", "rope_theta": 500.0})
    assert all(torch.equal(a, b) for a, b in zip(llama.parameters(), other_rope.parameters()))
    assert shared_prefix_layers(other_rope, llama) == 0  # every layer's weights equal, but not what they receive
