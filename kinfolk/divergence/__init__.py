"""Token-level divergences between a frozen and a current next-token distribution, without full logits.

Everything that compares a model with its frozen self goes through here: the retained-KL callback, the
Output-KL regulariser and the ATLAS measurements. The numbers are computed from last hidden states and the
LM head in tiles of tokens × vocabulary by TRL's `ChunkedDivergenceFunction` (the kernel of its distillation
trainer), so no (tokens × vocab) fp32 logits exist at once; the current side is differentiable.

Divergences, for frozen distribution p and current distribution q at one position:
`"forward_kl"` = KL(p‖q) (what "retained KL" means), `"reverse_kl"` = KL(q‖p), `"jsd"` = TRL's generalised JSD
with mixture m = (1 − β) q + β p (β = 0.5 is the symmetric Jensen–Shannon divergence).

Positions follow TRL's label convention: `values[:, t]` compares the distributions that predict
`labels[:, t + 1]`, and only positions whose next label is not -100 count (pass `labels=input_ids` with padding
set to -100 for "all tokens").

The package has three layers: `kernels` (the LM head, float64 normalisers, TRL's chunked divergence), `sources`
(what a frozen distribution is, the live sources and `token_divergence`) and `caches` (frozen sides computed once);
`factory.frozen_source` chooses among them for a training run. The frozen side comes from one of five sources:

- `DisabledAdapter()`: the same PEFT model under `model.disable_adapter()` — no second copy of the weights.
- `ReferenceModel(model)`: a separate frozen model with the same vocabulary (full fine-tuning).
- `HiddenStateCache.build(...)`: the frozen model's last hidden states over a fixed set of batches, computed
  once (from the disabled adapter, the model before training, or a reference model): exact for any vocabulary,
  and a measurement then costs one forward pass plus the head kernel. The default for measuring drift.
- `ExpectationCache.build(...)`: for a frozen head without soft-capping (PEFT), the two numbers per token that
  forward KL needs (the frozen distribution's expected output embedding and a float64 offset): exact, and a
  measurement costs one forward pass plus one chunked head pass, like the forward pass itself.
- `FrozenCache.build(...)`: frozen log-probs computed once over a fixed set of batches. Exact when `top_k` is
  None (sensible for small vocabularies: it stores every position × vocab). With `top_k` it keeps the k most
  likely tokens plus the tail mass r, and the forward KL it returns is that of the coarsened distributions
  (the k tokens plus one "other" bin). By the chain rule KL(p‖q) = KL_coarse + r·KL(p_tail‖q_tail), and since
  each tail probability is at most the k-th largest p_k, the omitted term lies in
  [0, r·log(min(1, p_k/r) / min_tail q_tail)]. `TokenDivergence.upper_bound` carries that bound per position.

>>> import torch
>>> from peft import LoraConfig, get_peft_model
>>> from kinfolk.testing import build_model
>>> model = get_peft_model(build_model("llama"), LoraConfig(target_modules=["q_proj"], init_lora_weights=False))
>>> ids = torch.tensor([[5, 6, 7, 8, 9]])
>>> result = token_divergence(model, ids, None, ids, frozen=DisabledAdapter())
>>> result.values.shape, int(result.mask.sum()), bool(result.mean() > 0)
(torch.Size([1, 4]), 4, True)
"""

from kinfolk.divergence.caches import ExpectationCache, FrozenCache, HiddenStateCache, batch_key
from kinfolk.divergence.factory import CACHES, FrozenSide, frozen_source
from kinfolk.divergence.kernels import (
    DEFAULT_TOKEN_CHUNK,
    DIVERGENCES,
    VOCAB_TILE,
    OutputHead,
    chunked_divergence,
    label_log_probs_from_hidden,
    last_hidden_states,
    log_normaliser,
    log_softmax,
    logit_scale,
)
from kinfolk.divergence.sources import (
    Comparison,
    DisabledAdapter,
    FrozenSource,
    ReferenceModel,
    TokenDivergence,
    token_divergence,
)

__all__ = [
    "CACHES",
    "DEFAULT_TOKEN_CHUNK",
    "DIVERGENCES",
    "VOCAB_TILE",
    "Comparison",
    "DisabledAdapter",
    "ExpectationCache",
    "FrozenCache",
    "FrozenSide",
    "FrozenSource",
    "HiddenStateCache",
    "OutputHead",
    "ReferenceModel",
    "TokenDivergence",
    "batch_key",
    "chunked_divergence",
    "frozen_source",
    "label_log_probs_from_hidden",
    "last_hidden_states",
    "log_normaliser",
    "log_softmax",
    "logit_scale",
    "token_divergence",
]
