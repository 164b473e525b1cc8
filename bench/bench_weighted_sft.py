"""Step time and peak memory of WeightedSFTTrainer against SFTTrainer on identical batches.

Layouts: padded and padding-free; WeightedSFTTrainer with every weight 1 and with random (log-normal) weights, on
the tokens SFTTrainer trains (a prompt loss weight would add tokens, i.e. work, not overhead). All variants see the
same data, seed, sampler and model initialisation. Step time: the three trainers take turns step by step in one
process (`step_times`), and each step-time ratio is the median of the per-step ratios, with their interquartile range
as its spread ("undecided" while it straddles the goal); peak memory: each variant trains in a fresh process
(`peak_memory`). The model is a random Llama, sized for the device (`SHAPES`).

    python bench/bench_weighted_sft.py [--steps 24 --rounds 1]   # about 15 minutes on two idle CPU cores

Ends by printing one JSON line: {"bench", "figures", "ratios", "spread", "goals", "verdicts", "pass"}.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import tempfile
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context

from timing import Spread, clock_for, interleaved, paired_ratio, report

GOAL = 1.02
LAYOUTS = {"padded": {}, "padding_free": {"padding_free": True, "max_length": None}}
VARIANTS = ("sft", "weighted_w1", "weighted_random")
# Model shapes: a GPU gets a model big enough for the step to be compute-bound, as in real training.
SHAPES = {
    "cpu": {"hidden_size": 256, "intermediate_size": 688, "num_hidden_layers": 2, "vocab_size": 8192},
    "cuda": {"hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 8, "vocab_size": 65536},
}


def _dataset(rows: int, seed: int = 0):
    """Prompt/completion rows of 40–400 tokens with log-normal weights, from the offline test kit's tasks."""
    from datasets import Dataset

    from kinfolk.testing import prompt_completion_dataset

    rng = random.Random(seed)
    tasks = prompt_completion_dataset(rows * 4, seed=seed)
    data = []
    for row in range(rows):
        prompt = " ".join(tasks[(row + k) % len(tasks)]["prompt"] for k in range(rng.randint(2, 12)))
        completion = "".join(tasks[(row + k) % len(tasks)]["completion"] for k in range(rng.randint(4, 30)))
        data.append({"prompt": prompt, "completion": completion, "weight": rng.lognormvariate(0.0, 0.75)})
    return Dataset.from_list(data)


def _peak_rss_reset() -> None:
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")  # resets VmHWM (Linux)


def _peak_rss_bytes() -> int:
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith("VmHWM:"))
    return int(line.split()[1]) * 1024


def _trainer(variant: str, layout: str, steps: int, batch_size: int):
    import torch
    from transformers import PrinterCallback, ProgressCallback
    from trl import SFTConfig, SFTTrainer

    from kinfolk.testing import build_model, build_tokenizer
    from kinfolk.trainers import WeightedSFTConfig, WeightedSFTTrainer

    cuda = torch.cuda.is_available()
    tokenizer = build_tokenizer()
    model = build_model("llama", **SHAPES["cuda" if cuda else "cpu"], seed=0)
    model.config.pad_token_id = tokenizer.pad_token_id
    data = _dataset(batch_size * steps)
    if variant == "weighted_w1":
        data = data.remove_columns("weight").add_column("weight", [1.0] * len(data))
    common = {
        "output_dir": tempfile.mkdtemp(),
        "max_steps": steps,
        "per_device_train_batch_size": batch_size,
        "gradient_checkpointing": False,
        "save_strategy": "no",
        "report_to": "none",
        "logging_steps": 10,
        "disable_tqdm": True,
        "use_cpu": not cuda,
        "bf16": cuda,
        "seed": 0,
        **LAYOUTS[layout],
    }
    if variant == "sft":
        trainer = SFTTrainer(model=model, args=SFTConfig(**common), train_dataset=data, processing_class=tokenizer)
    else:
        trainer = WeightedSFTTrainer(
            model=model, args=WeightedSFTConfig(**common), train_dataset=data, processing_class=tokenizer
        )
    for printer in (PrinterCallback, ProgressCallback):  # stdout carries only the final JSON line
        trainer.remove_callback(printer)
    return trainer


def step_times(layout: str, steps: int, warmup: int, batch_size: int) -> dict[str, list[float]]:
    """Seconds of each optimiser step per variant, the variants taking turns step by step in one process
    (bench/timing.py's `interleaved`, one step per round), so step i of every variant runs the same batch at nearly
    the same time (the ratios are taken step by step).

    A step is what `Trainer` does per update: collate the batch, count it (the weighted loss normaliser rides on
    that), forward, backward, optimiser. CPU: the process's CPU time (robust to other load on shared cores);
    GPU: wall time between synchronisations.
    """
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    import torch

    cuda = torch.cuda.is_available()
    trainers = {variant: _trainer(variant, layout, steps + warmup, batch_size) for variant in VARIANTS}

    def one_step(trainer):
        batches = iter(trainer.get_train_dataloader())

        def step():
            samples, num_items = trainer.get_batch_samples(batches, 1, trainer.args.device)
            trainer.training_step(trainer.model, samples[0], num_items)
            trainer.optimizer.step()
            trainer.optimizer.zero_grad(set_to_none=True)

        return step

    steps_by_variant = {}
    for variant, trainer in trainers.items():
        trainer.create_optimizer()
        trainer.current_gradient_accumulation_steps = 1
        steps_by_variant[variant] = one_step(trainer)
    return interleaved(
        steps_by_variant,
        repeats=steps,
        warmup=warmup,
        clock=clock_for("cuda" if cuda else "cpu"),
        synchronize=torch.cuda.synchronize if cuda else lambda: None,
    )


def peak_memory(variant: str, layout: str, steps: int, warmup: int, batch_size: int) -> float:
    """Peak bytes over the steps after warm-up of `trainer.train()`, in a fresh process (no allocator leftovers):
    CUDA's peak allocation on a GPU, the peak resident set (VmHWM) on a CPU."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    import torch
    from transformers import TrainerCallback

    cuda = torch.cuda.is_available()

    class ResetAfterWarmup(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == warmup:
                torch.cuda.reset_peak_memory_stats() if cuda else _peak_rss_reset()

    trainer = _trainer(variant, layout, steps + warmup, batch_size)
    trainer.add_callback(ResetAfterWarmup())
    trainer.train()
    return float(torch.cuda.max_memory_allocated() if cuda else _peak_rss_bytes())


def _in_fresh_process(function, *args):
    with ProcessPoolExecutor(max_workers=1, mp_context=get_context("spawn")) as worker:
        return worker.submit(function, *args).result()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=24, help="timed steps per variant (interleaved)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=1, help="fresh-process memory runs per variant (median)")
    parser.add_argument("--memory_steps", type=int, default=4)
    parser.add_argument("--batch_size", type=int, default=8)
    options = parser.parse_args()

    figures, spreads = {}, {}
    for layout in LAYOUTS:
        times = _in_fresh_process(step_times, layout, options.steps, options.warmup, options.batch_size)
        for variant in VARIANTS:
            figures[f"{layout}/{variant}/step_ms"] = 1000 * statistics.median(times[variant])
            peaks = [
                _in_fresh_process(peak_memory, variant, layout, options.memory_steps, 1, options.batch_size)
                for _ in range(options.rounds)
            ]
            figures[f"{layout}/{variant}/peak_mib"] = statistics.median(peaks) / 2**20
        for variant in VARIANTS[1:]:
            spreads[f"{layout}/{variant}/step_time"] = paired_ratio(times[variant], times["sft"])
            spreads[f"{layout}/{variant}/peak_memory"] = Spread.exact(
                figures[f"{layout}/{variant}/peak_mib"] / figures[f"{layout}/sft/peak_mib"]
            )
    import torch

    figures = {key: round(value, 3) for key, value in figures.items()}
    figures["device"] = "cuda" if torch.cuda.is_available() else "cpu"
    figures.update(
        timed_steps=options.steps, batch_size=options.batch_size, clock="wall" if torch.cuda.is_available() else "cpu"
    )
    print(json.dumps(report("weighted_sft", figures, spreads, {key: f"<= {GOAL}" for key in spreads})))


if __name__ == "__main__":
    main()
