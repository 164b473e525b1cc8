"""`KinfolkPlugin`: ATLANTIS weights, the ATLAS adapter and drift measurement in an axolotl run, from its YAML.

    plugins:
      - kinfolk.integrations.axolotl.KinfolkPlugin
    adapter: atlas                  # optional: the ATLAS tuner instead of LoRA
    kinfolk:
      weight_column: weight         # ATLANTIS: each row's weight scales its loss (WeightedSFTTrainer's loss)
      retained_dataset: retained.jsonl
      retained_kl: {every_n_steps: 10}

The hooks (axolotl's `BasePlugin`, `axolotl/integrations/base.py`):

- `load_datasets`: axolotl's own loading, with the weight column checked and carried through its prompt strategies
  and written on the tokens (`kinfolk.integrations.axolotl.weights`), before any model loads;
- `get_trainer_cls`, `get_collator_cls_and_kwargs`: `WeightedAxolotlTrainer` and its collator;
- `get_adapter_capabilities`, `load_adapter`: `adapter: atlas` builds (or, with `lora_model_dir`, loads) an ATLAS
  adapter; `post_trainer_create` fits its atlas on `kinfolk.retained_dataset` before the first step (every process
  of a launch runs the model on its share of the rows and they fit one atlas together, as in `kinfolk sft`);
- `add_callbacks_post_trainer`: `RetainedKLCallback` and `TargetMetricCallback`, which log into axolotl's records
  and write `drift.jsonl` in `output_dir`, so `kinfolk drift` and `kinfolk compare`'s report read the run.

Without a `kinfolk:` block the plugin changes nothing.
"""

from __future__ import annotations

from typing import Any

from axolotl.integrations.base import AdapterCapabilities, BasePlugin

from kinfolk.errors import InputError
from kinfolk.integrations.axolotl.args import KinfolkOptions

ADAPTER = "atlas"
# axolotl options whose batches or losses do not carry kinfolk's per-token weights, with the reason.
UNWEIGHTED_OPTIONS = {
    "sample_packing": "packs rows through its own batch-sampler collator",
    "batch_flattening": "flattens rows in a collator of its own",
    "eval_sample_packing": "packs evaluation rows through its own batch-sampler collator",
    "rl": "trains a preference or RL objective, not SFT",
    "orpo_alpha": "adds ORPO's loss",
    "pretraining_dataset": "streams pretraining data without dataset rows to weigh",
    "streaming": "streams rows that cannot be checked before training",
    "label_smoothing_factor": "smooths the loss over full logits, without the weights",
}


def options_of(cfg: Any) -> KinfolkOptions | None:
    """The `kinfolk:` block of a loaded axolotl config (None without one)."""
    block = cfg.get("kinfolk") if hasattr(cfg, "get") else None
    return None if block is None else KinfolkOptions.model_validate(dict(block))


def check_config(cfg: Any, options: KinfolkOptions) -> None:
    """Refuse, in one line, settings under which the plugin's weights or adapter would silently not apply."""
    if options.weighted:
        clashing = [f"{name} ({why})" for name, why in UNWEIGHTED_OPTIONS.items() if cfg.get(name)]
        if clashing:
            raise InputError(f"kinfolk's example weights cannot be honoured with {'; '.join(clashing)}")
    if cfg.get("adapter") == ADAPTER and cfg.get("lora_model_dir") is None:
        needs_data = options.atlas.residual != "plain"
        if needs_data and options.retained_dataset is None:
            raise InputError("adapter: atlas fits its atlas on kinfolk.retained_dataset, which is not set")


def atlas_arguments(options: KinfolkOptions):
    """The `kinfolk sft` ATLAS options (`AtlasArguments`) the YAML's `kinfolk.atlas` block spells."""
    from kinfolk.commands.sft_atlas_options import AtlasArguments

    atlas = options.atlas
    return AtlasArguments(
        use_atlas=True,
        atlas_retained_dataset=options.retained_dataset,
        atlas_retained_split=options.retained_split,
        atlas_retained_samples=atlas.samples,
        atlas_layers=atlas.layers,
        atlas_target_modules=atlas.target_modules,
        atlas_r=atlas.r,
        atlas_residual=atlas.residual,
        atlas_regions=atlas.regions,
        atlas_directions=atlas.directions,
        atlas_routing_temperature=atlas.routing_temperature,
        atlas_dtype=atlas.dtype,
        atlas_mask_prompt=atlas.mask_prompt,
        atlas_fit_batch_size=atlas.fit_batch_size,
        atlas_fit_max_length=atlas.fit_max_length,
        atlas_seed=atlas.seed,
    )


class KinfolkPlugin(BasePlugin):
    """kinfolk's axolotl plugin; see the module docstring and docs/axolotl.md."""

    def get_input_args(self) -> str:
        return "kinfolk.integrations.axolotl.args.KinfolkArgs"

    def get_adapter_capabilities(self) -> list[AdapterCapabilities]:
        return [AdapterCapabilities(name=ADAPTER)]

    # -- data -------------------------------------------------------------------------------------------------
    def load_datasets(self, cfg, preprocess: bool = False):
        options = options_of(cfg)
        if options is None or not options.weighted:
            return None
        check_config(cfg, options)
        from axolotl.common.datasets import load_datasets

        from kinfolk.integrations.axolotl.weights import carrying_weights, with_token_weights

        if options.weight_column is None:
            meta = load_datasets(cfg=cfg)
        else:
            with carrying_weights(options):
                meta = load_datasets(cfg=cfg)
        meta.train_dataset = with_token_weights(meta.train_dataset, options, "train", weighted=True)
        if meta.eval_dataset is not None:
            meta.eval_dataset = with_token_weights(meta.eval_dataset, options, "eval", weighted=False)
        return meta

    def pre_model_load(self, cfg) -> None:
        options = options_of(cfg)
        if options is not None:
            check_config(cfg, options)

    # -- the weighted loss ------------------------------------------------------------------------------------
    def get_trainer_cls(self, cfg):
        options = options_of(cfg)
        if options is None or not options.weighted:
            return None
        from kinfolk.integrations.axolotl.trainer import WeightedAxolotlTrainer

        return type(
            "WeightedAxolotlTrainer", (WeightedAxolotlTrainer,), {"weight_reduction": options.weight_reduction}
        )

    def get_collator_cls_and_kwargs(self, cfg, is_eval: bool = False):
        options = options_of(cfg)
        if options is None or not options.weighted:
            return None
        from kinfolk.integrations.axolotl.weights import WeightedSeq2SeqCollator

        return WeightedSeq2SeqCollator, {}

    # -- the ATLAS adapter ------------------------------------------------------------------------------------
    def load_adapter(self, model, cfg, inference: bool = False, config_only: bool = False):
        if cfg.get("adapter") != ADAPTER:
            return None
        from peft import PeftModel, get_peft_model

        options = options_of(cfg) or KinfolkOptions()
        config = atlas_arguments(options).peft_config()
        if config_only:
            return None, config
        if cfg.get("lora_model_dir"):
            model = PeftModel.from_pretrained(model, cfg["lora_model_dir"], is_trainable=not inference)
            return model, model.peft_config["default"]
        return get_peft_model(model, config), config

    def post_trainer_create(self, cfg, trainer) -> None:
        options = options_of(cfg)
        if cfg.get("adapter") != ADAPTER or cfg.get("lora_model_dir") or options is None:
            return
        if options.retained_dataset is None:  # the plain residual, which ignores the atlas
            return
        report = atlas_arguments(options).fit(
            trainer.model, trainer.processing_class, trainer.accelerator.is_local_main_process
        )
        trainer.accelerator.print(f"ATLAS: atlas fitted on {report.tokens} retained tokens in {report.seconds:.1f} s")

    # -- measurement ------------------------------------------------------------------------------------------
    def add_callbacks_post_trainer(self, cfg, trainer) -> list:
        options = options_of(cfg)
        if options is None:
            return []
        from kinfolk.integrations.axolotl.measurement import measuring_callbacks

        return measuring_callbacks(options, trainer, cfg.get("sequence_len"))
