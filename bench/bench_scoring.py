"""ATLANTIS scorer throughput: kinfolk's batched scorer vs a per-example loop vs a no-padding bound.

One random Llama-shaped model (a few M parameters, so a forward costs real compute on a CPU) scores the response
tokens of a prompt/completion dataset whose rows range from a few dozen to several hundred tokens:

- scorer: what `score_model` runs after tokenisation: rows length-sorted into chunks, padded batches under the
          token budget, `score_batches` (inference mode, TRL's fused LM head, float64 sums);
- loop:   the same rows one at a time (batch 1, no padding), the obvious hand-written scorer;
- bound:  the same tokens with no padding at all: the concatenated token stream cut into full rows and full
          batches of the same token budget. Rows are as wide as the token-weighted mean sequence length
          (Σ L² / Σ L), so causal attention costs the same per token as over the real sequences.

Throughput counts every sequence token (prompt and response, no padding), in tokens per second of process CPU time
(wall time on a GPU). The three methods take turns over `--repeats` rounds after a warm-up (bench/timing.py); each
ratio is the median of its per-round ratios, with their interquartile range as its spread. Goals: scorer/bound ≥ 0.90
(padding and bookkeeping cost < 10%) and scorer/loop ≥ 3 on a GPU, where batching is what makes scoring fast. On a
CPU a batch-1 forward is already compute-bound (the bound itself runs at about the loop's speed, `bound_over_loop`
≈ 1), so there the loop goal is ≥ 0.90: batching must cost nothing. A goal whose spread straddles it is
"undecided". Ends with one JSON line.

    OMP_NUM_THREADS=1 python bench/bench_scoring.py [--rows 128] [--tokens-per-batch 4096] [--device cuda]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics

import numpy as np
import torch
from datasets import Dataset
from timing import clock_for, interleaved, paired_ratio, report

from kinfolk.logprobs import label_log_probs
from kinfolk.plugins.atlantis.batching import chunk_plan, token_budget_batches
from kinfolk.plugins.atlantis.scoring import response_token_counts, score_batches
from kinfolk.testing import build_model, build_tokenizer
from kinfolk.tokens import sft_tokenize

WORDS = ("the", "model", "learns", "a", "new", "skill", "while", "its", "answers", "on", "retained", "work", "move")


def synthetic_dataset(rows: int, seed: int = 0) -> Dataset:
    """Prompts of 10-60 words and completions of 5-300 words, so sequence lengths vary widely."""
    rng = random.Random(seed)
    text = lambda n: " ".join(rng.choice(WORDS) for _ in range(n))  # noqa: E731
    return Dataset.from_list(
        [{"prompt": text(rng.randint(10, 60)), "completion": " " + text(rng.randint(5, 300))} for _ in range(rows)]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=128)
    parser.add_argument("--tokens-per-batch", type=int, default=4096)
    parser.add_argument("--chunk-rows", type=int, default=1024)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()

    tokenizer = build_tokenizer()
    model = build_model(
        "llama",
        "large",
        tokenizer=tokenizer,
        hidden_size=args.hidden,
        intermediate_size=args.hidden * 8 // 3,
        num_hidden_layers=args.layers,
        head_dim=args.hidden // 4,
        max_position_embeddings=4096,
    ).to(args.device)
    autocast_dtype = torch.bfloat16 if args.device.startswith("cuda") else None
    if autocast_dtype is not None:
        model = model.to(torch.bfloat16)
    synchronize = torch.cuda.synchronize if args.device.startswith("cuda") else lambda: None
    tokens = sft_tokenize(synthetic_dataset(args.rows), tokenizer)
    input_ids, labels = tokens["input_ids"], tokens["labels"]
    lengths = np.array([len(ids) for ids in input_ids])
    total_tokens = int(lengths.sum())
    pad = tokenizer.pad_token_id

    batches = [
        batch
        for chunk in chunk_plan(lengths, args.chunk_rows)
        for batch in token_budget_batches(chunk, lengths, args.tokens_per_batch)
    ]
    padded_tokens = sum(len(batch) * int(lengths[batch].max()) for batch in batches)

    def scorer() -> None:
        for _ in score_batches(model, input_ids, labels, batches, pad, autocast_dtype):
            pass

    def loop() -> None:
        for row in range(len(input_ids)):
            ids = torch.tensor([input_ids[row]], device=args.device)
            row_labels = torch.tensor([labels[row]], device=args.device)
            with torch.inference_mode(), torch.autocast(args.device.split(":")[0], enabled=autocast_dtype is not None):
                label_log_probs(model, ids, None, row_labels)[0].double().sum().item()

    width = round(float((lengths.astype(np.int64) ** 2).sum()) / total_tokens)
    stream = torch.tensor(np.concatenate([np.asarray(ids) for ids in input_ids])[: total_tokens // width * width])
    packed_rows = stream.view(-1, width)
    rows_per_batch = max(1, args.tokens_per_batch // width)

    def bound() -> None:
        for start in range(0, len(packed_rows), rows_per_batch):
            ids = packed_rows[start : start + rows_per_batch].to(args.device)
            with torch.inference_mode(), torch.autocast(args.device.split(":")[0], enabled=autocast_dtype is not None):
                label_log_probs(model, ids, None, ids)[0].double().sum(dim=-1).cpu()

    bound_tokens = packed_rows.numel()
    times = interleaved(
        {"scorer": scorer, "loop": loop, "bound": bound},
        args.repeats,
        clock=clock_for(args.device),
        synchronize=synchronize,
    )
    throughput = {
        "scorer": [total_tokens / t for t in times["scorer"]],
        "loop": [total_tokens / t for t in times["loop"]],
        "bound": [bound_tokens / t for t in times["bound"]],
    }
    spreads = {
        "scorer_over_bound": paired_ratio(throughput["scorer"], throughput["bound"]),
        "scorer_over_loop": paired_ratio(throughput["scorer"], throughput["loop"]),
    }
    median = {name: statistics.median(values) for name, values in throughput.items()}
    figures = {
        "scorer_tokens_per_s": median["scorer"],
        "loop_tokens_per_s": median["loop"],
        "bound_tokens_per_s": median["bound"],
        "rows": len(input_ids),
        "tokens": total_tokens,
        "response_tokens": int(response_token_counts(labels).sum()),
        "padding_fraction": 1 - total_tokens / padded_tokens,
        "batches": len(batches),
        "bound_row_width": width,
        # how much batching can gain at all here: on one CPU thread a batch-1 forward is already compute-bound
        "bound_over_loop": paired_ratio(throughput["bound"], throughput["loop"]).median,
        "parameters": sum(p.numel() for p in model.parameters()),
        "device": args.device,
        "torch_threads": torch.get_num_threads(),
        "rounds": args.repeats,
        "clock": "wall" if args.device.startswith("cuda") else "process cpu",
    }
    goals = {
        "scorer_over_bound": ">= 0.90",
        "scorer_over_loop": ">= 3" if args.device.startswith("cuda") else ">= 0.90",
    }
    figures = {k: round(v, 4) if isinstance(v, float) else v for k, v in figures.items()}
    print(json.dumps(report("atlantis_scoring", figures, spreads, goals)))


if __name__ == "__main__":
    main()
