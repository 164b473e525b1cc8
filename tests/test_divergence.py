"""kinfolk.divergence against a hand-written full-softmax reference on tiny models of every architecture.

The reference takes the model's own `logits` (so the architecture's scale and soft-capping come from
transformers, not from kinfolk), log-softmaxes the whole vocabulary and writes each divergence out by hand.
"""

import dataclasses
import math

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoConfig, AutoModelForCausalLM

from kinfolk.divergence import (
    DisabledAdapter,
    ExpectationCache,
    FrozenCache,
    HiddenStateCache,
    OutputHead,
    ReferenceModel,
    chunked_divergence,
    last_hidden_states,
    token_divergence,
)
from kinfolk.testing import ARCHITECTURES, build_model, perturbed_copy

PAD = 0


def batch():
    """Two right-padded rows; the second row's prompt is masked, as in a response-only SFT batch."""
    generator = torch.Generator().manual_seed(3)
    input_ids = torch.randint(1, 300, (2, 12), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    input_ids[1, 9:] = PAD
    attention_mask[1, 9:] = 0
    labels = input_ids.masked_fill(attention_mask == 0, -100)
    labels[1, :4] = -100
    return input_ids, attention_mask, labels


def reference_log_probs(model, input_ids, attention_mask, temperature=1.0):
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, :-1].float()
    return torch.log_softmax(logits / temperature, dim=-1)


def reference_divergence(log_p, log_q, kind, beta=0.5):
    """Per position, p frozen and q current, over the full vocabulary."""
    p, q = log_p.exp(), log_q.exp()
    if kind == "forward_kl":
        return (p * (log_p - log_q)).sum(-1)
    if kind == "reverse_kl":
        return (q * (log_q - log_p)).sum(-1)
    m = (1 - beta) * q + beta * p
    return beta * (p * (log_p - m.log())).sum(-1) + (1 - beta) * (q * (log_q - m.log())).sum(-1)


def tiny(architecture):
    if architecture == "cohere":  # the architecture with a logit_scale
        config = AutoConfig.for_model(
            "cohere",
            vocab_size=384,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            logit_scale=3.0,
            initializer_range=0.1,
            eos_token_id=None,
            bos_token_id=None,
            pad_token_id=None,
        )
        torch.manual_seed(0)
        return AutoModelForCausalLM.from_config(config).eval()
    overrides = {"final_logit_softcapping": 1.5} if architecture == "gemma2" else {}  # a cap tight enough to bite
    return build_model(architecture, **overrides)


@pytest.mark.parametrize("architecture", [*ARCHITECTURES, "cohere"])
@pytest.mark.parametrize("kind", ["forward_kl", "reverse_kl", "jsd"])
def test_reference_model_matches_full_softmax(architecture, kind):
    frozen = tiny(architecture)
    current = perturbed_copy(frozen, scale=0.05)
    input_ids, attention_mask, labels = batch()
    beta = 0.3
    result = token_divergence(current, input_ids, attention_mask, labels, ReferenceModel(frozen), kind=kind, beta=beta)
    with torch.no_grad():
        expected = reference_divergence(
            reference_log_probs(frozen, input_ids, attention_mask),
            reference_log_probs(current, input_ids, attention_mask),
            kind,
            beta,
        )
    mask = labels[:, 1:] != -100
    assert torch.equal(result.mask, mask)
    torch.testing.assert_close(result.values[mask], expected[mask], rtol=1e-4, atol=1e-6)
    assert torch.all(result.values[~mask] == 0)
    assert result.values[mask].min() > 0  # the copy really moved, so the comparison is not 0 == 0
    torch.testing.assert_close(result.mean(), expected[mask].mean(), rtol=1e-4, atol=1e-7)


def test_softcapping_and_scale_are_applied():
    """Dropping the soft-cap or the scale changes the answer: the agreement above is not an accident."""
    for architecture, field, value in (("gemma2", "softcap", None), ("cohere", "scale", 1.0)):
        frozen = tiny(architecture)
        current = perturbed_copy(frozen, scale=0.05)
        input_ids, attention_mask, labels = batch()
        mask = labels[:, 1:] != -100
        with torch.no_grad():
            hidden = [last_hidden_states(m, input_ids, attention_mask)[:, :-1][mask] for m in (current, frozen)]
            heads = [OutputHead.of(m) for m in (current, frozen)]
            right = chunked_divergence(hidden[0], heads[0], hidden[1], heads[1])
            wrong_heads = [dataclasses.replace(h, **{field: value}) for h in heads]
            wrong = chunked_divergence(hidden[0], wrong_heads[0], hidden[1], wrong_heads[1])
        assert not torch.allclose(right, wrong, rtol=1e-2), architecture


def test_token_chunks_do_not_change_the_result():
    frozen = tiny("qwen3")
    current = perturbed_copy(frozen)
    input_ids, attention_mask, labels = batch()
    mask = labels[:, 1:] != -100
    with torch.no_grad():
        hidden = [last_hidden_states(m, input_ids, attention_mask)[:, :-1][mask] for m in (current, frozen)]
        heads = [OutputHead.of(m) for m in (current, frozen)]
        whole = chunked_divergence(hidden[0], heads[0], hidden[1], heads[1])
        chunked = chunked_divergence(hidden[0], heads[0], hidden[1], heads[1], token_chunk_size=3)
    torch.testing.assert_close(chunked, whole)


@pytest.mark.parametrize("kind", ["forward_kl", "reverse_kl", "jsd"])
def test_gradients_match_autograd_on_full_reference(kind):
    frozen = tiny("gemma2")
    current = perturbed_copy(frozen)
    current.train(False)
    input_ids, attention_mask, labels = batch()
    mask = labels[:, 1:] != -100

    token_divergence(current, input_ids, attention_mask, labels, ReferenceModel(frozen), kind=kind).mean().backward()
    ours = {name: p.grad.clone() for name, p in current.named_parameters() if p.grad is not None}
    current.zero_grad(set_to_none=True)

    with torch.no_grad():
        log_p = reference_log_probs(frozen, input_ids, attention_mask)
    log_q = reference_log_probs(current, input_ids, attention_mask)
    reference_divergence(log_p, log_q, kind)[mask].mean().backward()
    expected = {name: p.grad for name, p in current.named_parameters() if p.grad is not None}

    assert ours.keys() == expected.keys()
    assert any(g.abs().max() > 0 for g in expected.values())
    for name in expected:
        torch.testing.assert_close(ours[name], expected[name], rtol=1e-3, atol=1e-6, msg=name)


def lora(base, seed=5):
    torch.manual_seed(seed)
    config = LoraConfig(target_modules=["q_proj", "v_proj", "down_proj"], r=4, init_lora_weights=False)
    return get_peft_model(base, config)


@pytest.mark.parametrize("architecture", ["llama", "gemma2"])
def test_disabled_adapter_is_the_frozen_model_and_gradients_reach_lora(architecture):
    base = tiny(architecture)
    frozen_copy = perturbed_copy(base, scale=0.0)
    model = lora(base)
    input_ids, attention_mask, labels = batch()
    mask = labels[:, 1:] != -100

    result = token_divergence(model, input_ids, attention_mask, labels, DisabledAdapter())
    result.mean().backward()
    ours = {name: p.grad.clone() for name, p in model.named_parameters() if p.requires_grad}
    model.zero_grad(set_to_none=True)

    with torch.no_grad():
        log_p = reference_log_probs(frozen_copy, input_ids, attention_mask)
    log_q = reference_log_probs(model, input_ids, attention_mask)
    expected = reference_divergence(log_p, log_q, "forward_kl")
    torch.testing.assert_close(result.values[mask], expected[mask].detach(), rtol=1e-4, atol=1e-6)
    expected[mask].mean().backward()
    assert all("lora_" in name for name in ours)
    for name, p in model.named_parameters():
        if p.requires_grad:
            torch.testing.assert_close(ours[name], p.grad, rtol=1e-3, atol=1e-7, msg=name)


def test_disabled_adapter_needs_a_peft_model():
    input_ids, attention_mask, labels = batch()
    with pytest.raises(TypeError, match="PeftModel"):
        token_divergence(tiny("llama"), input_ids, attention_mask, labels, DisabledAdapter())


def test_adapted_lm_head_is_refused():
    model = get_peft_model(tiny("llama"), LoraConfig(target_modules=["lm_head"], r=2))
    with pytest.raises(NotImplementedError, match="lm_head"):
        OutputHead.of(model)


@pytest.mark.parametrize("kind", ["forward_kl", "reverse_kl", "jsd"])
def test_exact_cache_equals_reference_model(kind, tmp_path):
    frozen = tiny("olmo2")
    current = perturbed_copy(frozen)
    input_ids, attention_mask, labels = batch()
    cache = FrozenCache.build(frozen, [{"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}])
    cache = FrozenCache.load(cache.save(tmp_path / "frozen.safetensors"))
    from_cache = token_divergence(current, input_ids, attention_mask, labels, cache, kind=kind)
    from_model = token_divergence(current, input_ids, attention_mask, labels, ReferenceModel(frozen), kind=kind)
    torch.testing.assert_close(from_cache.values, from_model.values, rtol=1e-4, atol=1e-6)
    assert from_cache.upper_bound is None

    # gradients through the checkpointed cache path equal the kernel's
    from_cache.mean().backward()
    ours = [p.grad.clone() for p in current.parameters()]
    current.zero_grad(set_to_none=True)
    from_model.mean().backward()
    for got, want in zip(ours, (p.grad for p in current.parameters())):
        torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-7)


def coarse_forward_kl(log_p, log_q, k):
    """KL between the distributions coarsened to their top-k tokens (by p) plus one tail bin, written out."""
    top = log_p.topk(k, dim=-1).indices
    p, q = log_p.exp(), log_q.exp()
    p_top, q_top = p.gather(-1, top), q.gather(-1, top)
    p_tail, q_tail = 1 - p_top.sum(-1), 1 - q_top.sum(-1)
    return (p_top * (p_top / q_top).log()).sum(-1) + p_tail * (p_tail / q_tail).log()


@pytest.mark.parametrize("k", [1, 8, 64])
def test_top_k_cache_is_the_coarse_kl_and_its_bound_holds(k):
    frozen = tiny("mistral")
    current = perturbed_copy(frozen, scale=0.1)
    input_ids, attention_mask, labels = batch()
    mask = labels[:, 1:] != -100
    cache = FrozenCache.build(
        frozen, [{"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}], top_k=k
    )
    result = token_divergence(current, input_ids, attention_mask, labels, cache)
    with torch.no_grad():
        log_p = reference_log_probs(frozen, input_ids, attention_mask).double()
        log_q = reference_log_probs(current, input_ids, attention_mask).double()
    exact = reference_divergence(log_p, log_q, "forward_kl")[mask]
    coarse = coarse_forward_kl(log_p, log_q, k)[mask]
    values, bound = result.values[mask].double(), result.upper_bound[mask].double()
    torch.testing.assert_close(values, coarse, rtol=1e-3, atol=1e-6)
    assert torch.all(values <= exact + 1e-6)  # coarsening never increases a KL
    assert torch.all(exact <= values + bound + 1e-6)  # and the tail adds at most the bound
    assert bound.max() > 0


def test_top_k_cache_gradients_match_coarse_reference():
    frozen = tiny("qwen2")
    current = perturbed_copy(frozen, scale=0.1)
    input_ids, attention_mask, labels = batch()
    mask = labels[:, 1:] != -100
    cache = FrozenCache.build(
        frozen, [{"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}], top_k=16
    )
    token_divergence(current, input_ids, attention_mask, labels, cache).mean().backward()
    ours = [p.grad.clone() for p in current.parameters()]
    current.zero_grad(set_to_none=True)
    with torch.no_grad():
        log_p = reference_log_probs(frozen, input_ids, attention_mask)
    coarse_forward_kl(log_p, reference_log_probs(current, input_ids, attention_mask), 16)[mask].mean().backward()
    for got, want in zip(ours, (p.grad for p in current.parameters())):
        torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-7)


def test_cache_refuses_what_it_cannot_answer():
    frozen = tiny("llama")
    input_ids, attention_mask, labels = batch()
    rows = [{"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}]
    cache = FrozenCache.build(frozen, rows, top_k=4)
    with pytest.raises(ValueError, match="forward_kl only"):
        token_divergence(frozen, input_ids, attention_mask, labels, cache, kind="reverse_kl")
    with pytest.raises(ValueError, match="temperature"):
        token_divergence(frozen, input_ids, attention_mask, labels, cache, temperature=2.0)
    with pytest.raises(KeyError, match="not in the frozen cache"):
        token_divergence(frozen, input_ids[:1], attention_mask[:1], labels[:1], cache)
    with pytest.raises(ValueError, match="top_k"):
        FrozenCache.build(frozen, rows, top_k=384)


def test_temperature_and_identity():
    frozen = tiny("qwen2")
    current = perturbed_copy(frozen)
    input_ids, attention_mask, labels = batch()
    mask = labels[:, 1:] != -100
    with torch.no_grad():
        same = token_divergence(frozen, input_ids, attention_mask, labels, ReferenceModel(frozen))
        hot = token_divergence(current, input_ids, attention_mask, labels, ReferenceModel(frozen), temperature=2.0)
        expected = reference_divergence(
            reference_log_probs(frozen, input_ids, attention_mask, 2.0),
            reference_log_probs(current, input_ids, attention_mask, 2.0),
            "forward_kl",
        )
    assert same.values.abs().max() < 1e-5
    torch.testing.assert_close(hot.values[mask], expected[mask], rtol=1e-4, atol=1e-6)


def test_all_masked_batch_is_a_differentiable_zero():
    frozen = tiny("llama")
    current = perturbed_copy(frozen)
    input_ids, attention_mask, _ = batch()
    labels = torch.full_like(input_ids, -100)
    result = token_divergence(current, input_ids, attention_mask, labels, ReferenceModel(frozen))
    assert result.mean().item() == 0.0 and result.count().item() == 0
    result.mean().backward()  # must not raise: a regulariser may meet such a micro-batch
    cache = FrozenCache.build(frozen, [{"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}])
    assert token_divergence(current, input_ids, attention_mask, labels, cache).count().item() == 0


def test_jsd_beta_must_lie_strictly_inside():
    frozen = tiny("llama")
    input_ids, attention_mask, labels = batch()
    with pytest.raises(ValueError, match="0 < beta < 1"):
        token_divergence(frozen, input_ids, attention_mask, labels, ReferenceModel(frozen), kind="jsd", beta=1.0)
    with pytest.raises(ValueError, match="unknown divergence"):
        token_divergence(frozen, input_ids, attention_mask, labels, ReferenceModel(frozen), kind="kl")
    assert math.isfinite(
        token_divergence(frozen, input_ids, attention_mask, labels, ReferenceModel(frozen), kind="jsd").mean().item()
    )


def test_bf16_models_agree_with_their_own_logits():
    frozen = tiny("qwen3")
    current = perturbed_copy(frozen, scale=0.05).to(torch.bfloat16)
    frozen = frozen.to(torch.bfloat16)
    input_ids, attention_mask, labels = batch()
    mask = labels[:, 1:] != -100
    with torch.no_grad():
        result = token_divergence(current, input_ids, attention_mask, labels, ReferenceModel(frozen))
        expected = reference_divergence(
            reference_log_probs(frozen, input_ids, attention_mask),
            reference_log_probs(current, input_ids, attention_mask),
            "forward_kl",
        )
    assert result.values.dtype == torch.float32
    torch.testing.assert_close(result.values[mask], expected[mask], rtol=0.1, atol=1e-3)


def test_hidden_state_cache_from_disabled_adapter_is_exact(tmp_path):
    model = lora(tiny("gemma2"))
    input_ids, attention_mask, labels = batch()
    rows = [{"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}]
    cache = HiddenStateCache.build(model, rows, disable_adapter=True)
    assert cache.head is None  # the PEFT head is frozen: read live, never copied
    cache = HiddenStateCache.load(cache.save(tmp_path / "hidden.safetensors"))
    from_cache = token_divergence(model, input_ids, attention_mask, labels, cache)
    live = token_divergence(model, input_ids, attention_mask, labels, DisabledAdapter())
    torch.testing.assert_close(from_cache.values, live.values)
    assert live.values.max() > 0
    from_cache.mean().backward()
    ours = {name: p.grad.clone() for name, p in model.named_parameters() if p.requires_grad}
    model.zero_grad(set_to_none=True)
    live.mean().backward()
    for name, p in model.named_parameters():
        if p.requires_grad:
            torch.testing.assert_close(ours[name], p.grad, msg=name)


def test_hidden_state_cache_keeps_the_frozen_head_under_full_fine_tuning(tmp_path):
    model = tiny("qwen2")  # tied embeddings: training the embedding moves the head too
    frozen_copy = perturbed_copy(model, scale=0.0)
    input_ids, attention_mask, labels = batch()
    rows = [{"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}]
    cache = HiddenStateCache.build(model, rows)
    assert cache.head is not None
    cache = HiddenStateCache.load(cache.save(tmp_path / "hidden.safetensors"))
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.05)
        from_cache = token_divergence(model, input_ids, attention_mask, labels, cache)
        expected = token_divergence(model, input_ids, attention_mask, labels, ReferenceModel(frozen_copy))
    torch.testing.assert_close(from_cache.values, expected.values)
    assert expected.values.max() > 0
    with pytest.raises(ValueError, match="not a FrozenCache"):
        FrozenCache.load(tmp_path / "hidden.safetensors")


@pytest.mark.parametrize("architecture", ["llama", "qwen3", "cohere"])
def test_expectation_cache_is_exact_forward_kl_with_one_projection(architecture, tmp_path):
    model = lora(tiny(architecture))
    input_ids, attention_mask, labels = batch()
    rows = [{"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}]
    cache = ExpectationCache.build(model, rows, disable_adapter=True)
    cache = ExpectationCache.load(cache.save(tmp_path / "expectation.safetensors"))
    from_cache = token_divergence(model, input_ids, attention_mask, labels, cache)
    live = token_divergence(model, input_ids, attention_mask, labels, DisabledAdapter())
    mask = labels[:, 1:] != -100
    torch.testing.assert_close(from_cache.values[mask], live.values[mask], rtol=1e-4, atol=1e-6)
    assert live.values[mask].min() > 0
    from_cache.mean().backward()
    ours = {name: p.grad.clone() for name, p in model.named_parameters() if p.requires_grad}
    model.zero_grad(set_to_none=True)
    live.mean().backward()
    for name, p in model.named_parameters():
        if p.requires_grad:
            torch.testing.assert_close(ours[name], p.grad, rtol=1e-3, atol=1e-7, msg=name)


def test_expectation_cache_refuses_what_is_not_linear_or_not_frozen():
    input_ids, attention_mask, labels = batch()
    rows = [{"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}]
    with pytest.raises(ValueError, match="soft-capping"):
        ExpectationCache.build(lora(tiny("gemma2")), rows, disable_adapter=True)
    with pytest.raises(ValueError, match="trainable"):
        ExpectationCache.build(tiny("llama"), rows)
    model = lora(tiny("llama"))
    cache = ExpectationCache.build(model, rows, disable_adapter=True)
    with pytest.raises(ValueError, match="forward_kl only"):
        token_divergence(model, input_ids, attention_mask, labels, cache, kind="jsd")
