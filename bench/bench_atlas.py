"""ATLAS cost, side by side in one run: prefill and decode latency of the frozen model, LoRA and ATLAS (same rank and
placement); the atlas fit (streamed k-means) against scikit-learn's KMeans on the same activations; atlas size.

Model: a random Qwen3-shaped decoder (about 54M parameters on CPU; `--shape qwen3-8b` for the paper's shape on a
GPU), the adapter on the attention output projection of the layer at 47% depth, rank 16, K = 16 regions, p = 8.
Frozen, LoRA and ATLAS take turns over `--repeats` rounds after a warm-up (bench/timing.py), in process CPU time on a
CPU and wall time on a GPU; each ratio is the median of its per-round ratios, with their interquartile range as its
spread, and a goal that spread straddles is "undecided". The adapted module is also timed alone.
Prints exactly one JSON line at the end.

    OMP_NUM_THREADS=1 python bench/bench_atlas.py
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

import torch
from peft import get_peft_model
from timing import Spread, clock_for, interleaved, paired_ratio, report
from transformers import AutoConfig, AutoModelForCausalLM

import kinfolk  # noqa: F401  (registers ATLAS)
from kinfolk.plugins.atlas import AtlasConfig, fit_atlas
from kinfolk.plugins.atlas.kmeans import StreamedKMeans, inertia
from kinfolk.plugins.atlas_comparators import matching_lora_config

SHAPES = {
    # ~54M parameters: 12 layers × 512 wide, Qwen3 block structure (q/k norms, GQA, head_dim 64).
    "medium": dict(hidden_size=512, intermediate_size=1536, num_hidden_layers=12, num_attention_heads=8,
                   num_key_value_heads=4, head_dim=64, vocab_size=32000),
    # Qwen3-8B: 36 layers × 4096, 32 heads of 128, 8 KV heads.
    "qwen3-8b": dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
                     num_key_value_heads=8, head_dim=128, vocab_size=151936),
}  # fmt: skip
PAPER_OVERHEAD = {"prefill": 0.0583, "decode": 0.0252}  # Qwen3-8B vs frozen (Table 26, lower ends)


def build(shape: str, device: str, dtype: torch.dtype, seed: int = 0):
    config = AutoConfig.for_model("qwen3", **SHAPES[shape], max_position_embeddings=4096, tie_word_embeddings=True)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model.to(device).eval()


def retained_tokens(vocab: int, rows: int, length: int, seed: int = 1) -> list[dict]:
    """Token batches standing in for retained data: a random model has no language, so random ids do as well."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(vocab, (rows, length), generator=g)
    return [{"input_ids": chunk, "attention_mask": torch.ones_like(chunk)} for chunk in ids.split(8)]


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def latencies(models: dict, batch: int, prompt: int, new_tokens: int, repeats: int, device: str) -> dict:
    """Per-round prefill seconds and decode seconds per token of each model, the models taking turns."""
    ids = torch.randint(1000, (batch, prompt), generator=torch.Generator().manual_seed(2)).to(device)
    mask = torch.ones_like(ids)

    def prefill(model):
        return lambda: model(input_ids=ids, attention_mask=mask, use_cache=False, logits_to_keep=1)

    def generate(model):
        return lambda: model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens,
                                      min_new_tokens=new_tokens, do_sample=False)  # fmt: skip

    runs = {}
    for name, model in models.items():
        runs[f"{name}/prefill"], runs[f"{name}/generate"] = prefill(model), generate(model)
    with torch.inference_mode():
        seconds = interleaved(runs, repeats, clock=clock_for(device), synchronize=lambda: sync(device))
    # decode time per generated token: each round's generation minus that round's prefill, over the new tokens
    return {
        name: {
            "prefill": seconds[f"{name}/prefill"],
            "decode": [
                max(whole - first, 0.0) / new_tokens
                for whole, first in zip(seconds[f"{name}/generate"], seconds[f"{name}/prefill"])
            ],
        }
        for name in models
    }


def module_latencies(modules: dict, inputs: dict[str, torch.Tensor], repeats: int, device: str) -> dict:
    """Per-round time of the adapted module alone (frozen, LoRA, ATLAS) on prefill- and decode-sized inputs."""
    runs = {
        f"{name}/{kind}": lambda m=module, x=x: [m(x) for _ in range(10)]
        for name, module in modules.items()
        for kind, x in inputs.items()
    }
    with torch.inference_mode():
        seconds = interleaved(runs, repeats, clock=clock_for(device), synchronize=lambda: sync(device))
    return {name: {kind: [t / 10 for t in seconds[f"{name}/{kind}"]] for kind in inputs} for name in modules}


def medians(samples: dict) -> dict:
    return {
        name: {kind: statistics.median(values) for kind, values in kinds.items()} for name, kinds in samples.items()
    }


class _Captured(Exception):
    pass


def activations(model, batches, module_name: str) -> torch.Tensor:
    """The adapted module's inputs on every token, running the model only up to that module."""
    rows = []

    def hook(module, args):
        rows.append(args[0].flatten(0, 1))
        raise _Captured

    handle = model.get_submodule(module_name).register_forward_pre_hook(hook)
    with torch.inference_mode():
        for batch in batches:
            with contextlib.suppress(_Captured):
                model(**batch, use_cache=False)
    handle.remove()
    return torch.cat(rows).float().cpu()


def kmeans_comparison(rows: torch.Tensor, k: int, seeds: list[int], clock) -> dict:
    """Streamed k-means (as fit_atlas runs it, without the covariances) vs scikit-learn KMeans, same rows; the two
    run back to back for each seed, which pairs their times."""
    from sklearn.cluster import KMeans

    from kinfolk.stats import bootstrap_interval

    ours, theirs = [], []
    array = rows.numpy()
    for seed in seeds:
        km = StreamedKMeans(k, seed=seed, covariance=False)
        start = clock()
        while not km.done:
            for chunk in rows.split(8192):
                km.observe(chunk)
            km.end_pass()
        ours.append((clock() - start, inertia(rows, km.centers)))
        start = clock()
        fitted = KMeans(n_clusters=k, init="k-means++", n_init=1, random_state=seed).fit(array)
        theirs.append((clock() - start, inertia(rows, torch.from_numpy(fitted.cluster_centers_))))
    ratio = bootstrap_interval(lambda a, b: float(a.mean() / b.mean()), [i for _, i in ours], [i for _, i in theirs])
    return {
        "time_ratio": paired_ratio([t for t, _ in theirs], [t for t, _ in ours]),
        "kmeans_seconds": statistics.median(t for t, _ in ours),
        "sklearn_seconds": statistics.median(t for t, _ in theirs),
        "kmeans_inertia": statistics.mean(i for _, i in ours),
        "sklearn_inertia": statistics.mean(i for _, i in theirs),
        "inertia_ratio": ratio,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="medium")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--prompt", type=int, default=256)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=7, help="timed rounds, after one warm-up round")
    parser.add_argument("--fit-rows", type=int, default=48, help="retained sequences of 256 tokens for fit_atlas")
    parser.add_argument("--kmeans-rows", type=int, default=128, help="sequences of 256 tokens for the k-means race")
    parser.add_argument("--regions", type=int, default=16)
    parser.add_argument("--seeds", type=int, default=5)
    args = parser.parse_args(argv)
    dtype = torch.bfloat16 if args.device.startswith("cuda") else torch.float32
    torch.manual_seed(0)

    frozen = build(args.shape, args.device, dtype)
    atlas_config = AtlasConfig(r=16, num_regions=args.regions, num_directions=8, residual="atlas")
    atlas = get_peft_model(build(args.shape, args.device, dtype), atlas_config)
    lora = get_peft_model(build(args.shape, args.device, dtype), matching_lora_config(frozen, atlas_config))
    target = atlas.base_model.targeted_module_names[0]
    batches = retained_tokens(frozen.config.vocab_size, args.fit_rows, 256)
    fit = fit_atlas(atlas, batches, progress=False)
    for model in (atlas, lora):  # non-zero B, as after training (the cost does not depend on the values)
        for name, parameter in model.named_parameters():
            if parameter.requires_grad and ("atlas_B" in name or "lora_B" in name):
                torch.nn.init.normal_(parameter, std=0.01)

    _log(f"fit_atlas: {fit.seconds:.1f}s on {fit.tokens} tokens")
    models = {"frozen": frozen, "lora": lora, "atlas": atlas}
    speed_rounds = latencies(models, args.batch, args.prompt, args.new_tokens, args.repeats, args.device)
    speed = medians(speed_rounds)
    _log(f"latencies: {speed}")
    rows = activations(frozen, retained_tokens(frozen.config.vocab_size, args.kmeans_rows, 256, seed=3), target)
    kmeans = kmeans_comparison(rows, args.regions, list(range(args.seeds)), clock_for(args.device))
    modules = {"frozen": frozen, "lora": lora.base_model.model, "atlas": atlas.base_model.model}
    module_inputs = {
        "prefill": rows[: args.batch * args.prompt].to(args.device, dtype),
        "decode": rows[: args.batch].to(args.device, dtype),
    }
    module_rounds = module_latencies(
        {name: model.get_submodule(target) for name, model in modules.items()},
        module_inputs,
        args.repeats,
        args.device,
    )
    module_speed = medians(module_rounds)
    _log(f"adapted module: {module_speed}")
    _log(f"k-means: {kmeans}")
    with tempfile.TemporaryDirectory() as directory:
        atlas.save_pretrained(Path(directory) / "atlas")
        lora.save_pretrained(Path(directory) / "lora")
        atlas_file = os.path.getsize(Path(directory) / "atlas" / "adapter_model.safetensors")
        lora_file = os.path.getsize(Path(directory) / "lora" / "adapter_model.safetensors")

    spreads = {
        f"atlas_over_{other}_{kind}": paired_ratio(speed_rounds["atlas"][kind], speed_rounds[other][kind])
        for other in ("lora", "frozen")
        for kind in ("prefill", "decode")
    }
    spreads["sklearn_over_kmeans_time"] = kmeans["time_ratio"]
    # not a timing: the spread is the ratio of mean inertias' bootstrap interval over seeds
    interval = kmeans["inertia_ratio"]
    spreads["kmeans_over_sklearn_inertia"] = Spread(interval.estimate, interval.low, interval.high, args.seeds)
    goals = {
        "atlas_over_lora_prefill": "<= 1.15",
        "atlas_over_lora_decode": "<= 1.15",
        "atlas_over_frozen_prefill": f"<= {1 + PAPER_OVERHEAD['prefill']:.4f}",
        "atlas_over_frozen_decode": f"<= {1 + PAPER_OVERHEAD['decode']:.4f}",
        "sklearn_over_kmeans_time": ">= 2",
        "kmeans_over_sklearn_inertia": "<= 1.01",
    }
    figures = {
        "shape": args.shape,
        "device": args.device,
        "dtype": str(dtype).removeprefix("torch."),
        "threads": torch.get_num_threads(),
        "parameters": sum(p.numel() for p in frozen.parameters()),
        "adapted_module": target,
        "batch_x_prompt": f"{args.batch}x{args.prompt}",
        "new_tokens": args.new_tokens,
        "prefill_seconds": {name: round(v["prefill"], 5) for name, v in speed.items()},
        "decode_seconds_per_token": {name: round(v["decode"], 6) for name, v in speed.items()},
        "module_seconds": {name: {k: round(v, 7) for k, v in kinds.items()} for name, kinds in module_speed.items()},
        "module_atlas_over_lora": {
            k: round(paired_ratio(module_rounds["atlas"][k], module_rounds["lora"][k]).median, 3)
            for k in module_inputs
        },
        # the adapted module's extra time over the whole frozen model's: the overhead free of whole-model noise
        "module_overhead_vs_frozen_model": {
            k: round((module_speed["atlas"][k] - module_speed["frozen"][k]) / speed["frozen"][k], 4)
            for k in module_inputs
        },
        "fit_atlas_seconds": round(fit.seconds, 3),
        "fit_tokens": fit.tokens,
        "fit_passes": fit.passes,
        "kmeans_rows_x_dim": list(rows.shape),
        "kmeans_seconds": round(kmeans["kmeans_seconds"], 4),
        "sklearn_kmeans_seconds": round(kmeans["sklearn_seconds"], 4),
        "kmeans_inertia": kmeans["kmeans_inertia"],
        "sklearn_inertia": kmeans["sklearn_inertia"],
        "kmeans_over_sklearn_inertia_ci95": [kmeans["inertia_ratio"].low, kmeans["inertia_ratio"].high],
        "kmeans_seeds": args.seeds,
        "atlas_nbytes": atlas.base_model.atlas_nbytes(),
        "atlas_adapter_file_bytes": atlas_file,
        "lora_adapter_file_bytes": lora_file,
        "paper_overhead_vs_frozen": PAPER_OVERHEAD,
        "gpu_check": "pending" if not args.device.startswith("cuda") else "this run",
        "rounds": args.repeats,
        "clock": "wall" if args.device.startswith("cuda") else "process cpu",
    }
    print(json.dumps(report("atlas", figures, spreads, goals)))
    return 0


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
