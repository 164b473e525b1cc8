"""The baselines ATLAS is judged against, at the same placement and rank: LoRA, and CorDA-KPM (PEFT's
knowledge-preserving CorDA initialisation from the retained data's input covariance). It sits beside the tuner
package, not in it: `plugins/atlas/` holds the tuner only, as PEFT's tuner packages do.

Both are PEFT's own implementations; this module only configures them like a given `AtlasConfig` so that a
comparison changes the method and nothing else (the paper's Table 5: every method updates the same attention
output matrix at rank 16, 2·16·4096 = 131,072 trainable parameters on Qwen3-8B).

>>> from kinfolk.plugins.atlas import AtlasConfig
>>> from kinfolk.testing import build_model
>>> lora = matching_lora_config(build_model("qwen3", "large"), AtlasConfig(r=16))
>>> sorted(lora.target_modules), lora.layers_to_transform, lora.r, lora.lora_alpha
(['self_attn.o_proj'], [2], 16, 16)
"""

from __future__ import annotations

from peft import LoraConfig, PeftModel, get_peft_model
from torch import nn

from kinfolk.plugins.atlas.config import AtlasConfig
from kinfolk.plugins.atlas.model import default_placement


def matching_lora_config(model: nn.Module, atlas_config: AtlasConfig, **lora_kwargs) -> LoraConfig:
    """A `LoraConfig` on the modules `atlas_config` adapts, at its rank (`lora_alpha = r` unless given: scale 1)."""
    target_modules, layers = atlas_config.target_modules, atlas_config.layers_to_transform
    if target_modules is None:
        target_modules, default_layers = default_placement(model)
        layers = default_layers if layers is None else layers
    fields = {
        "r": atlas_config.r,
        "lora_alpha": atlas_config.r,
        "target_modules": sorted(target_modules) if isinstance(target_modules, set) else target_modules,
        "layers_to_transform": layers,
        "layers_pattern": atlas_config.layers_pattern,
        "exclude_modules": atlas_config.exclude_modules,
        "task_type": atlas_config.task_type,
    }
    return LoraConfig(**(fields | lora_kwargs))


def corda_kpm_model(
    model: nn.Module,
    atlas_config: AtlasConfig,
    retained,
    tokenizer=None,
    *,
    max_length: int | None = 1024,
    **lora_kwargs,
) -> PeftModel:
    """Wrap `model` with a CorDA-KPM LoRA adapter at ATLAS's placement and rank, initialised from `retained`.

    CorDA rewrites the base weight (W ← W − B·A, so the adapted model starts equal to the base), which means a
    disabled adapter no longer gives the original model: save with `save_pretrained(dir,
    path_initial_model_for_weight_conversion=init_dir)` after saving the untrained adapter to `init_dir`, to get a
    LoRA that applies to the original base. `retained` is a dataset or batches as for `fit_atlas`; rows are run one
    at a time, unpadded, as CorDA's covariance hook expects.
    """
    from peft.tuners.lora.config import CordaConfig
    from peft.tuners.lora.corda import preprocess_corda

    from kinfolk.plugins.atlas.fit import batches_of

    config = matching_lora_config(
        model, atlas_config, init_lora_weights="corda", corda_config=CordaConfig(corda_method="kpm"), **lora_kwargs
    )
    device = next(model.parameters()).device
    rows = batches_of(retained, tokenizer, batch_size=1, max_length=max_length)

    def run_model():
        for batch in rows:
            model(input_ids=batch["input_ids"].to(device), use_cache=False)

    preprocess_corda(model, config, run_model=run_model)
    return get_peft_model(model, config)


def matching_osf_config(model: nn.Module, atlas_config: AtlasConfig):
    """An `OSFConfig` (PEFT's orthogonal subspace fine-tuning) on the modules `atlas_config` adapts, training as many
    of each weight's singular directions as ATLAS's rank: OSF freezes the top `effective_rank` directions and trains
    the rest, so `effective_rank = min(out, in) − r` gives r · (in + out + 1) trainable parameters against LoRA's
    r · (in + out).

    >>> from kinfolk.plugins.atlas import AtlasConfig
    >>> from kinfolk.testing import build_model
    >>> osf = matching_osf_config(build_model("qwen3", "large"), AtlasConfig(r=4, layers_to_transform=[1]))
    >>> osf.target_modules, osf.effective_rank
    (['layers.1.self_attn.o_proj'], 60)
    """
    from peft import OSFConfig

    target_modules, layers = atlas_config.target_modules, atlas_config.layers_to_transform
    if target_modules is None:
        target_modules, default_layers = default_placement(model)
        layers = default_layers if layers is None else layers
    pattern = atlas_config.layers_pattern or "layers"
    suffixes = [f"{pattern}.{layer}.{module}" for layer in layers for module in sorted(target_modules)]
    modules = [m for name, m in model.named_modules() if any(name.endswith(s) for s in suffixes)]
    ranks = {min(m.weight.shape) for m in modules}
    if len(modules) != len(suffixes) or len(ranks) != 1:
        raise ValueError(f"OSF needs one module per target of equal shape: {suffixes} matched {len(modules)}")
    return OSFConfig(effective_rank=ranks.pop() - atlas_config.r, target_modules=suffixes)
