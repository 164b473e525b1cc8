"""A curve of patched sizes measured from shared prefixes against full forwards, on SmolLM2-135M-Instruct.

The real-boomerang experiments measure every size between a student and its teacher (`kinfolk merge patch --all`,
both orders: 34 sizes for SmolLM2's 16-layer student) on held-out rows against the teacher's log-probabilities. A
size patched front to back starts with the teacher's blocks, one patched back to front with the student's layers,
bit for bit; `SharedPrefixes` keeps what each layer of the teacher and of the unpatched student receives on the rows
and `measure_size` starts each size at the deepest layer it shares (checked against its full forward on a batch).

The student is SmolLM2-135M-Instruct's {every: 2, last: 1} layer-dropped init (16 of 30 layers) with seeded noise on
every weight (a stand-in for a trained one, whose embeddings and layers differ from the teacher's). A round builds
and measures the whole curve once each way (sizes built in memory as the lab does; the shared side's captures of
both models included, though the lab captures the teacher once for all of a seed's arms), in turn, round after
round (`--repeats` after a warm-up, bench/timing.py), in process CPU time on a CPU.

Goals: full / shared >= 1.15 (median of the per-round ratios, "undecided" while their interquartile range straddles
it) and the two agree at every size (log perplexity and KL, relative difference <= 1e-6). The layer forwards a
curve runs either way are counted and reported beside it (782 against 335 per row: 57 % skipped); what both sides
pay bounds the ratio: building each size (about 2 s), the head (49k x 576, about 8 layers' weights) and the KL over
the vocabulary at every size. Measured (32 rows of 64 tokens, one thread, beside two training processes): 290
against 237 CPU seconds, 1.22; at the lab's 192 rows the per-size building weighs less. Ends with one JSON line.

    OMP_NUM_THREADS=1 nice python bench/bench_size_curve.py [--rows 8] [--length 64] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

import torch
from timing import Spread, clock_for, interleaved, paired_ratio, report
from transformers import AutoModelForCausalLM, AutoTokenizer

from kinfolk.lab.methods.adapt.size_curves import ORDERS, SharedPrefixes, measure_size, patched_sizes
from kinfolk.lab.world.heldout import TeacherReference, rows_from
from kinfolk.layout import decoder_layers
from kinfolk.plugins.adapt import LayerMap, merge
from kinfolk.testing import perturbed_copy, save_model

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tools/ lives at the repository root
from tools.real_models import default_cache_dir, find_real_model, prepare_sonnets

MODEL = "smollm2-135m-instruct"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=8, help="held-out rows (windows of the sonnets)")
    parser.add_argument("--length", type=int, default=64, help="tokens per row (the experiments' 64)")
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds, after one warm-up round")
    args = parser.parse_args()
    teacher_dir = find_real_model(MODEL)
    if teacher_dir is None:
        raise SystemExit(f"{MODEL} is not in {default_cache_dir()}: run `make real-models`")
    tokenizer = AutoTokenizer.from_pretrained(teacher_dir)
    teacher = AutoModelForCausalLM.from_pretrained(teacher_dir, dtype=torch.float32).eval()
    ids = tokenizer(prepare_sonnets().read_text(encoding="utf-8"))["input_ids"]
    texts = [tokenizer.decode(ids[i * args.length : (i + 1) * args.length]) for i in range(args.rows)]
    reference = TeacherReference(teacher, [rows_from("sonnets", tokenizer, texts, None, args.length)])

    with tempfile.TemporaryDirectory() as folder:
        init = merge({"op": "init-student", "teacher": str(teacher_dir), "layers": {"every": 2, "last": 1}},
                     Path(folder) / "init", progress=False)  # fmt: skip
        student = perturbed_copy(AutoModelForCausalLM.from_pretrained(init), scale=0.01, seed=3).eval()
        student_dir = save_model(student, tokenizer, Path(folder) / "student")
        LayerMap.load(init).save(student_dir)
        measured: dict[str, list[tuple[float, float]]] = {}
        layer_forwards: dict[str, int] = {}

        def curve(name: str):
            def run():
                prefixes = ()
                if name == "shared":
                    prefixes = (SharedPrefixes(teacher, reference), SharedPrefixes(student, reference))
                points, forwards = [], 0
                for order in ORDERS:
                    for _, model in patched_sizes(teacher_dir, student_dir, order):
                        values, layer = measure_size(model, reference, prefixes)
                        points.append((values["sonnets"].nll, values["sonnets"].kl))
                        forwards += len(decoder_layers(model)) - layer
                measured[name], layer_forwards[name] = points, forwards

            return run

        times = interleaved({"full": curve("full"), "shared": curve("shared")}, args.repeats, clock=clock_for("cpu"))

    disagreement = max(
        abs(a - b) / max(abs(a), 1e-12)
        for full, shared in zip(measured["full"], measured["shared"], strict=True)
        for a, b in zip(full, shared)
    )
    figures = {
        "model": MODEL,
        "student": "every 2nd layer and the last (16 of 30), seeded noise",
        "sizes": len(measured["full"]),
        "tokens": args.rows * args.length,
        "seconds": {name: round(statistics.median(values), 3) for name, values in times.items()},
        "layer_forwards_per_row": layer_forwards,
        "max_relative_disagreement": disagreement,
        "rounds": args.repeats,
        "clock": "process cpu",
        "threads": torch.get_num_threads(),
    }
    spreads = {
        "full_over_shared": paired_ratio(times["full"], times["shared"]),
        "max_relative_disagreement": Spread.exact(disagreement),
    }
    goals = {"full_over_shared": ">= 1.15", "max_relative_disagreement": "<= 1e-6"}
    print(json.dumps(report("size_curve", figures, spreads, goals)))


if __name__ == "__main__":
    main()
