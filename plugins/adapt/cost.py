"""What one example costs on a model, from its config and safetensors headers (no weights loaded).

Two measures, both proportional to the tokens an example runs through the model (prompt and response):

- `parameters`: the N parameters a token multiplies with × tokens (the paper's x-axis: inference-time parameters):
  all but an untied model's input embedding table, which a token only looks up. A tied table is also the LM head and
  counts once. Counting the looked-up table made a patched size that got its own head dearer than the tied model it
  was cut from, though it does one block less of the same products;
- `flops`: forward-pass FLOPs, Kaplan et al. (2020): 2·N per token, plus 2·n_layers·t·d_attn for attention over the
  t positions before it, summed over t = 1..T: 2·N·T + n_layers·d_attn·T·(T + 1).

`ModelCost.parameters` keeps the checkpoint's stored count for the record.

>>> cost = ModelCost(parameters=1000, forward_parameters=900, num_layers=2, attention_width=8)
>>> cost.of(10, "parameters"), cost.of(10, "flops")  # 900·10; 2·900·10 + 2·8·10·11
(9000.0, 19760.0)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from kinfolk.errors import InputError

COST_KINDS = ("parameters", "flops")


@dataclass(frozen=True)
class ModelCost:
    parameters: int  # stored in the checkpoint
    forward_parameters: int  # multiplied by every token: all but an untied model's input embedding table
    num_layers: int
    attention_width: int  # query heads × head dimension

    def of(self, tokens: float, kind: str) -> float:
        """The cost of running `tokens` tokens through the model, in `kind` units."""
        if kind == "parameters":
            return float(self.forward_parameters * tokens)
        if kind == "flops":
            return float(
                2 * self.forward_parameters * tokens + self.num_layers * self.attention_width * tokens * (tokens + 1)
            )
        raise InputError(f"unknown cost kind {kind!r}; choose one of {', '.join(COST_KINDS)}")


def model_cost(directory: str | Path, role: str = "model") -> ModelCost:
    """The cost figures of the model in `directory` (config.json and safetensors headers only); `role` names it in
    errors."""
    from kinfolk.plugins.adapt.checkpoint import Checkpoint  # torch: not needed for `kinfolk route --help`

    checkpoint = Checkpoint.open_model(role, directory)
    sizes = {name: math.prod(shape) for name, (shape, _) in checkpoint.manifest.items()}
    embeddings = f"{checkpoint.layout.embeddings}.weight"
    head_saved = f"{checkpoint.layout.lm_head}.weight" in sizes
    # an untied model's embedding table is a lookup; a tied one's is also the head, which every token multiplies by
    lookup_only = sizes.get(embeddings, 0) if head_saved or not checkpoint.layout.tied_embeddings else 0
    text = checkpoint.config.get_text_config()
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    return ModelCost(
        parameters=sum(sizes.values()),
        forward_parameters=sum(sizes.values()) - lookup_only,
        num_layers=checkpoint.layout.num_layers,
        attention_width=text.num_attention_heads * head_dim,
    )
