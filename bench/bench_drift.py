"""Cost of one retained-KL measurement against one plain forward pass over the same retained set.

A random model of a realistic shape (`--preset cpu`: Llama-like, 8 × 512 wide, 32k vocabulary, fp32;
`--preset gpu`: the Qwen3-8B shape in bf16) gets a LoRA adapter on every attention output projection and a
retained set of random contexts whose second half counts as the response. Timed in turn, round after round
(`--repeats` rounds after a warm-up, bench/timing.py), in process CPU time on a CPU and wall time on a GPU:

- forward:  `model(input_ids, attention_mask).logits` over every batch, the plain forward pass;
- callback: `RetainedKLCallback.measure()` with its default frozen side (`cache="auto"`: the expectation
            cache for a PEFT model), what runs at each evaluation;
- hidden / live: the same measurement with `cache="hidden"` (frozen hidden states, two head projections) and
            `cache="none"` (the frozen side recomputed under the disabled adapter: a second forward pass).

The three measurements must agree (they are exact); the goal is callback ≤ 1.2 × forward, on the median of the
per-round ratios, "undecided" while their interquartile range straddles 1.2. The one-off cache build at train start
is reported but not part of the ratio. Ends with one JSON line.

    OMP_NUM_THREADS=2 python bench/bench_drift.py [--preset cpu|gpu] [--contexts 16] [--length 256]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time

import torch
from datasets import Dataset
from peft import LoraConfig, get_peft_model
from timing import Spread, clock_for, interleaved, paired_ratio, report
from transformers import AutoConfig, AutoModelForCausalLM, Trainer, TrainingArguments

from kinfolk.callbacks.retained_kl import RetainedKLCallback

PRESETS = {
    "cpu": {
        "config": {
            "model_type": "llama",
            "hidden_size": 512,
            "intermediate_size": 1408,
            "num_hidden_layers": 8,
            "num_attention_heads": 8,
            "num_key_value_heads": 8,
            "vocab_size": 32000,
        },
        "dtype": torch.float32,
        "contexts": 16,
        "length": 256,
        "batch_size": 8,
    },
    "gpu": {
        "config": {
            "model_type": "qwen3",
            "hidden_size": 4096,
            "intermediate_size": 12288,
            "num_hidden_layers": 36,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "head_dim": 128,
            "vocab_size": 151936,
            "tie_word_embeddings": False,
        },
        "dtype": torch.bfloat16,
        "contexts": 256,
        "length": 384,
        "batch_size": 16,
    },
}


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), default=None, help="default: gpu when CUDA is available")
    parser.add_argument("--contexts", type=int, default=None)
    parser.add_argument("--length", type=int, default=None)
    parser.add_argument("--batch-size", type=int, default=None)
    parser.add_argument("--layers", type=int, default=None, help="override the preset's layer count")
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds, after one warm-up round")
    args = parser.parse_args()
    preset = PRESETS[args.preset or ("gpu" if torch.cuda.is_available() else "cpu")]
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    contexts = args.contexts or preset["contexts"]
    length = args.length or preset["length"]
    batch_size = args.batch_size or preset["batch_size"]
    fields = dict(preset["config"])
    if args.layers:
        fields["num_hidden_layers"] = args.layers
    model_type = fields.pop("model_type")
    config = AutoConfig.for_model(model_type, max_position_embeddings=max(length, 512), **fields)

    torch.manual_seed(0)
    with torch.device(device):
        base = AutoModelForCausalLM.from_config(config, dtype=preset["dtype"])
    lora = LoraConfig(r=16, target_modules=["o_proj"], init_lora_weights=False)
    model = get_peft_model(base, lora).eval()

    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(10, config.vocab_size, (contexts, length), generator=generator)
    labels = ids.clone()
    labels[:, : length // 2] = -100  # the second half is the "response"
    retained = Dataset.from_dict({"input_ids": ids.tolist(), "labels": labels.tolist()})

    with tempfile.TemporaryDirectory() as output_dir:
        training_args = TrainingArguments(output_dir=output_dir, report_to=[], use_cpu=device.type == "cpu")
        trainer = Trainer(model=model, args=training_args)
        trainer.log = lambda logs: None  # measuring, not training: nothing to report to

        callbacks, build_seconds = {}, {}
        for name, cache in (("callback", "auto"), ("hidden", "hidden"), ("live", "none")):
            callback = RetainedKLCallback(trainer, retained, cache=cache, batch_size=batch_size, max_length=length)
            start = time.perf_counter()
            callback._build_frozen(trainer.state)
            synchronize(device)
            build_seconds[name] = time.perf_counter() - start
            callbacks[name] = callback

        batches = [{key: value.to(device) for key, value in batch.items()} for batch in callbacks["callback"].batches]

        def forward():
            with torch.inference_mode():
                for batch in batches:
                    model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits  # noqa: B018

        measured = {}

        def measurement(name: str):
            def run():
                measured[name] = callbacks[name].measure()["retained_kl"]

            return run

        times = interleaved(
            {"forward": forward, **{name: measurement(name) for name in callbacks}},
            args.repeats,
            clock=clock_for(device.type),
            synchronize=lambda: synchronize(device),
        )

    reference = measured["live"]
    disagreement = max(abs(value - reference) / max(abs(reference), 1e-12) for value in measured.values())
    seconds = {name: statistics.median(values) for name, values in times.items()}
    figures = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "shape": f"{model_type} {config.num_hidden_layers}x{config.hidden_size} vocab {config.vocab_size}",
        "dtype": str(preset["dtype"]).removeprefix("torch."),
        "tokens": contexts * length,
        "scored_tokens": int((labels[:, 1:] != -100).sum()),
        "seconds": {name: round(value, 4) for name, value in seconds.items()},
        "cache_build_seconds": {name: round(value, 4) for name, value in build_seconds.items()},
        "cache_used": callbacks["callback"].cache_used,
        "retained_kl": measured,
        "max_relative_disagreement": disagreement,
        "rounds": args.repeats,
        "clock": "wall" if device.type == "cuda" else "process cpu",
    }
    spreads = {
        f"{name}_over_forward": paired_ratio(times[name], times["forward"]) for name in ("callback", "hidden", "live")
    }
    spreads["max_relative_disagreement"] = Spread.exact(disagreement)
    tolerance = 1e-3 if preset["dtype"] == torch.float32 else 2e-2
    goals = {"callback_over_forward": "<= 1.2", "max_relative_disagreement": f"<= {tolerance:g}"}
    print(json.dumps(report("drift", figures, spreads, goals)))


if __name__ == "__main__":
    main()
