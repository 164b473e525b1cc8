"""Measuring from the first changed layer against full forwards, on SmolLM2-135M-Instruct at the default placement.

SmolLM2-135M-Instruct (from `make real-models`) gets a LoRA (rank 16, randomly initialised so the KL is not zero)
on the attention output of its one decoder layer at 0.47 of the depth (ATLAS's default placement, layer 14 of 30).
One measurement is what `kinfolk compare` does at each evaluation: the retained KL (`RetainedKLCallback.measure()`,
default frozen side) on contexts of Shakespeare's sonnets and the target score (`TargetMetricCallback.score()` of
`validation_nll`) on other contexts. Timed in turn, round after round (`--repeats` rounds after a warm-up,
bench/timing.py), in process CPU time on a CPU and wall time on a GPU:

- before:     the measurement as it was before measuring from the first changed layer: full forwards, and the
              target's log-probs from TRL's fused head over every position (`kinfolk.logprobs.label_log_probs`);
- full:       both callbacks with `measure_from_layer=False`: every forward runs all 30 layers (the target's head
              on the scored positions only, as now);
- from_layer: both with `measure_from_layer=True` (their default): layers 14.. and the head only.

Goals: before / from_layer >= 1.7, the measuring cost per checkpoint against what it was (median of the per-round
ratios, "undecided" while their interquartile range straddles it), and the three agree on the KL and the score
(relative difference <= 1e-5). `full_over_from_layer`, the skipped layers' share alone, is reported beside it: the
head (a fifth of SmolLM2's weights, 49k × 576) runs on both sides, which bounds it near 30/16 = 1.9 times less the
head's share. The one-off build of the kept states is reported, not timed. Ends with one JSON line.

    OMP_NUM_THREADS=1 nice python bench/bench_measure_from_layer.py [--contexts 4] [--length 512] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from datasets import Dataset
from peft import LoraConfig, get_peft_model
from timing import Spread, clock_for, interleaved, paired_ratio, report
from transformers import AutoModelForCausalLM, AutoTokenizer, Trainer, TrainingArguments

from kinfolk.batches import retained_batches
from kinfolk.callbacks.retained_kl import RetainedKLCallback
from kinfolk.callbacks.target_metric import TargetMetricCallback, ValidationNLL
from kinfolk.layout import model_layout
from kinfolk.logprobs import label_log_probs
from kinfolk.plugins.atlas.model import default_layer

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tools/ lives at the repository root
from tools.real_models import default_cache_dir, find_real_model, prepare_sonnets

MODEL = "smollm2-135m-instruct"


def contexts_of(text: str, tokenizer, count: int, length: int, skip: int) -> Dataset:
    """`count` consecutive `length`-token windows of `text` after `skip` windows; the second half is scored."""
    ids = tokenizer(text)["input_ids"]
    windows = [ids[start : start + length] for start in range((skip) * length, (skip + count) * length, length)]
    if len(windows[-1]) < length:
        raise SystemExit(f"the sonnets hold fewer than {(skip + count) * length} tokens; ask for fewer contexts")
    labels = [[-100] * (length // 2) + window[length // 2 :] for window in windows]
    return Dataset.from_dict({"input_ids": windows, "labels": labels})


def fused_head_nll(batches):
    """The target measure as it was: log-probs of every position from TRL's fused head, the scored ones summed."""

    def measure(model, _tokenizer) -> float:
        total = tokens = 0.0
        device = next(model.parameters()).device
        with torch.no_grad():
            for batch in batches:
                batch = {name: tensor.to(device) for name, tensor in batch.items()}
                log_probs, mask = label_log_probs(model, batch["input_ids"], batch["attention_mask"], batch["labels"])
                total += float(log_probs.double().sum())
                tokens += float(mask.sum())
        return total / max(tokens, 1.0)

    return measure


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--contexts", type=int, default=4, help="retained contexts, and as many validation ones")
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds, after one warm-up round")
    args = parser.parse_args()
    path = find_real_model(MODEL)
    if path is None:
        raise SystemExit(f"{MODEL} is not in {default_cache_dir()}: run `make real-models`")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    tokenizer = AutoTokenizer.from_pretrained(path)
    base = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(device)
    layer = default_layer(model_layout(base).num_layers)
    torch.manual_seed(0)
    lora = LoraConfig(r=16, target_modules=["o_proj"], layers_to_transform=[layer], init_lora_weights=False)
    model = get_peft_model(base, lora).eval()

    text = prepare_sonnets().read_text(encoding="utf-8")
    retained = contexts_of(text, tokenizer, args.contexts, args.length, skip=0)
    validation = contexts_of(text, tokenizer, args.contexts, args.length, skip=args.contexts)
    measure = ValidationNLL(retained_batches(validation, tokenizer, "response", args.length, args.batch_size))

    with tempfile.TemporaryDirectory() as output_dir:
        training_args = TrainingArguments(output_dir=output_dir, report_to=[], use_cpu=device.type == "cpu")
        trainer = Trainer(model=model, args=training_args, processing_class=tokenizer)
        pairs, build_seconds, measured = {}, {}, {}
        for name, from_layer in (("before", False), ("full", False), ("from_layer", True)):
            retained_kl = RetainedKLCallback(
                trainer, retained, batch_size=args.batch_size, max_length=args.length, measure_from_layer=from_layer
            )
            scored = fused_head_nll(measure.batches) if name == "before" else measure
            target = TargetMetricCallback(trainer, scored, measure_from_layer=from_layer)
            start = time.perf_counter()
            retained_kl._build_frozen(trainer.state)  # what train start does: frozen side and kept states
            target.score()  # the first score keeps its own states
            build_seconds[name] = time.perf_counter() - start
            pairs[name] = (retained_kl, target)

        def measurement(name: str):
            def run():
                retained_kl, target = pairs[name]
                measured[name] = (retained_kl.measure()["retained_kl"], target.score())

            return run

        synchronize = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        times = interleaved(
            {name: measurement(name) for name in pairs},
            args.repeats,
            clock=clock_for(device.type),
            synchronize=synchronize,
        )

    reference = measured["before"]
    disagreement = max(
        abs(a - b) / max(abs(a), 1e-12) for values in measured.values() for a, b in zip(reference, values)
    )
    figures = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "model": MODEL,
        "placement": f"LoRA r16 on layer {layer}'s o_proj of {model_layout(base).num_layers}",
        "from_layer": pairs["from_layer"][0].prefix.layer,
        "tokens": 2 * args.contexts * args.length,
        "seconds": {name: round(statistics.median(values), 4) for name, values in times.items()},
        "build_seconds": {name: round(value, 4) for name, value in build_seconds.items()},
        "retained_kl": {name: value[0] for name, value in measured.items()},
        "target": {name: value[1] for name, value in measured.items()},
        "max_relative_disagreement": disagreement,
        "rounds": args.repeats,
        "clock": "wall" if device.type == "cuda" else "process cpu",
        "threads": torch.get_num_threads(),
    }
    spreads = {
        "before_over_from_layer": paired_ratio(times["before"], times["from_layer"]),
        "full_over_from_layer": paired_ratio(times["full"], times["from_layer"]),
        "before_over_full": paired_ratio(times["before"], times["full"]),
        "max_relative_disagreement": Spread.exact(disagreement),
    }
    goals = {"before_over_from_layer": ">= 1.7", "max_relative_disagreement": "<= 1e-5"}
    print(json.dumps(report("measure_from_layer", figures, spreads, goals)))


if __name__ == "__main__":
    main()
