"""Tiny random causal LMs of the architectures kinfolk supports, in two sizes of one family.

"small" is 2 layers × 32 wide and "large" 4 layers × 64 wide; both share the kit's tokenizer, so they form a
same-family pair like Qwen2-1.5B / Qwen2-7B. Weights are random but seeded, and drawn wider than the default
initialiser so next-token distributions are far from uniform (tests of log-probs and KL need that).

>>> from kinfolk.testing import build_tokenizer, build_model
>>> tok = build_tokenizer()
>>> model = build_model("qwen3", "small", vocab_size=len(tok))
>>> model.config.num_hidden_layers
2
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig, PreTrainedModel

ARCHITECTURES = ("llama", "qwen2", "qwen3", "gemma2", "mistral", "olmo2")

SIZES = {
    "small": {"num_hidden_layers": 2, "hidden_size": 32, "intermediate_size": 64, "head_dim": 8},
    "large": {"num_hidden_layers": 4, "hidden_size": 64, "intermediate_size": 128, "head_dim": 16},
}


def tiny_config(architecture: str, size: str = "small", vocab_size: int = 384, **overrides) -> PretrainedConfig:
    """A config of `architecture` ("llama", "qwen2", "qwen3", "gemma2", "mistral", "olmo2") at a tiny size."""
    if architecture not in ARCHITECTURES:
        raise ValueError(f"unknown tiny architecture {architecture!r}; choose one of {', '.join(ARCHITECTURES)}")
    if size not in SIZES:
        raise ValueError(f"unknown tiny size {size!r}; choose one of {', '.join(SIZES)}")
    shape = SIZES[size]
    fields = {
        "vocab_size": vocab_size,
        "hidden_size": shape["hidden_size"],
        "intermediate_size": shape["intermediate_size"],
        "num_hidden_layers": shape["num_hidden_layers"],
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 512,
        "initializer_range": 0.1,
        "pad_token_id": None,
    }
    if architecture in ("qwen3", "gemma2", "mistral", "llama"):
        fields["head_dim"] = shape["head_dim"]
    if architecture == "gemma2":
        # Alternating sliding/full attention as in Gemma 2; a short window so tests cross it.
        fields.update(sliding_window=16, query_pre_attn_scalar=shape["head_dim"])
    if architecture == "mistral":
        fields["sliding_window"] = 64
    fields.update(overrides)
    return AutoConfig.for_model(architecture, **fields)


def build_model(
    architecture: str,
    size: str = "small",
    vocab_size: int = 384,
    seed: int = 0,
    tokenizer=None,
    **overrides,
) -> PreTrainedModel:
    """A seeded random model in fp32; pass `tokenizer` to copy its eos/pad ids into the configs."""
    if tokenizer is not None:
        vocab_size = len(tokenizer)
        overrides.setdefault("eos_token_id", tokenizer.eos_token_id)
        overrides.setdefault("pad_token_id", tokenizer.pad_token_id)
        overrides.setdefault("bos_token_id", None)
    config = tiny_config(architecture, size, vocab_size, **overrides)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.eval()
    if tokenizer is not None:
        model.generation_config.eos_token_id = tokenizer.eos_token_id
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def perturbed_copy(model: PreTrainedModel, scale: float = 0.05, seed: int = 1) -> PreTrainedModel:
    """A copy of `model` with seeded Gaussian noise added to every parameter: a stand-in for a fine-tuned sibling."""
    copy = type(model)(model.config)
    copy.load_state_dict(model.state_dict())
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in copy.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * scale)
    copy.eval()
    return copy


def save_model(model: PreTrainedModel, tokenizer, directory: str | Path, max_shard_size: str | None = None) -> Path:
    """Save as a safetensors directory with the tokenizer; `max_shard_size` (e.g. "40KB") gives a sharded one."""
    directory = Path(directory)
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(directory, **kwargs)
    if tokenizer is not None:
        tokenizer.save_pretrained(directory)
    return directory
