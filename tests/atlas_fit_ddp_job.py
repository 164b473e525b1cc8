"""`fit_atlas` on every rank with the same data, as a user calls a trainer; run by tests/test_atlas_fit_ddp.py.

    python -m torch.distributed.run --nproc_per_node 2 atlas_fit_ddp_job.py MODEL_DIR OUT_DIR

Each rank saves, per case, its fitted atlas tensors, the fit report and the rows its own forward passes ran on to
OUT_DIR/rank{R}.pt; `fit_case(name, model_dir)` is the same fit in one process, for the test's reference.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from peft import get_peft_model
from torch import nn
from transformers import AutoModelForCausalLM
from two_process_helpers import gloo_group

from kinfolk.plugins.atlas import AtlasConfig, fit_atlas
from kinfolk.testing import build_tokenizer, text_dataset

ATLAS_BUFFERS = ("centers", "in_basis", "in_spectrum", "out_basis", "out_spectrum", "calibration")
O_PROJ = "model.layers.1.self_attn.o_proj"
# name: (retained rows, regions, directions); 7 rows split 3 + 4, one row leaves rank 0 without any
CASES = {"lm_regions": (7, 3, 2), "lm_one_row": (1, 1, 2), "mlp_blobs": (5, 3, 2)}


def blob_batches(batches: int, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    """Batches of 6-d points around three well separated centres, 30 points each."""
    generator = torch.Generator().manual_seed(seed)
    means = torch.eye(6)[:3] * 12
    return [
        {"input": means[torch.randint(3, (30,), generator=generator)] + torch.randn(30, 6, generator=generator)}
        for _ in range(batches)
    ]


def blob_model(num_regions: int, num_directions: int) -> nn.Module:
    torch.manual_seed(0)
    mlp = nn.Sequential()
    mlp.add_module("lin0", nn.Linear(6, 5))
    mlp.add_module("act", nn.ReLU())
    mlp.add_module("lin1", nn.Linear(5, 3))
    return get_peft_model(
        mlp, AtlasConfig(target_modules=["lin0"], r=2, num_regions=num_regions, num_directions=num_directions)
    )


def fit_case(name: str, model_dir: str, own_share: bool = False, seed: int = 0) -> dict:
    """Fit case `name` (under whatever process group is initialised); the atlas, the report and the forward rows.
    `own_share`: each rank passes only its own block of the rows, with `split_across_ranks=False`."""
    rows, regions, directions = CASES[name]
    forwarded = []

    def counting(model, batch):
        forwarded.append(next(iter(batch.values())).shape[0])
        inputs = {key: value for key, value in batch.items() if key != "labels"}
        return model(inputs["input"]) if "input" in inputs else model(**inputs, use_cache=False)

    if name == "mlp_blobs":
        model, data, module, tokenizer = blob_model(regions, directions), blob_batches(rows), "lin0", None
    else:
        tokenizer = build_tokenizer()
        config = AtlasConfig(r=4, num_regions=regions, num_directions=directions)
        model = get_peft_model(AutoModelForCausalLM.from_pretrained(model_dir), config)
        data, module = text_dataset(rows), O_PROJ
    if own_share:
        rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
        data = data.select(range(rank * rows // world, (rank + 1) * rows // world))
    report = fit_atlas(
        model,
        data,
        tokenizer=tokenizer,
        batch_size=2,
        forward_fn=counting,
        progress=False,
        seed=seed,
        split_across_ranks=not own_share,
    )
    layer = model.base_model.model.get_submodule(module)
    return {
        "atlas": {key: getattr(layer, f"atlas_{key}")["default"].clone() for key in ATLAS_BUFFERS},
        "tokens": report.tokens,
        "region_tokens": next(iter(report.region_tokens.values())),
        "rank_rows": report.rank_rows,
        "forward_rows_first_pass": sum(forwarded[: len(forwarded) // report.passes]),
        "forward_calls": len(forwarded),
    }


def inputs_of(name: str, model_dir: str, seed: int = 0) -> torch.Tensor:
    """The adapted module's inputs on every real token of case `name`'s data (`seed` 0: the fitted rows; another:
    held-out rows), from the plain base model."""
    rows = CASES[name][0] if seed == 0 else 8
    if name == "mlp_blobs":
        return torch.cat([batch["input"] for batch in blob_batches(rows, seed)])
    from kinfolk.batches import retained_batches

    tokenizer = build_tokenizer()
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    captured = []
    model.get_submodule(O_PROJ).register_forward_pre_hook(lambda module, args: captured.append(args[0]))
    with torch.no_grad():
        for batch in retained_batches(text_dataset(rows, seed), tokenizer, "all", batch_size=2):
            model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
            captured[-1] = captured[-1][batch["attention_mask"].bool()]
    return torch.cat(captured)


if __name__ == "__main__":
    model_dir, out_dir = sys.argv[1:3]
    with gloo_group() as (rank, world_size):
        results = {"world_size": world_size}
        results.update({name: fit_case(name, model_dir) for name in CASES})
        results["lm_regions_own_share"] = fit_case("lm_regions", model_dir, own_share=True)
        torch.save(results, Path(out_dir) / f"rank{rank}.pt")
