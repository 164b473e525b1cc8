"""apply-delta on a generated multi-shard checkpoint: kinfolk vs a naive load-everything merge vs mergekit.

Generates a Llama-shaped fp32 checkpoint (`init`, ≥ 1 GB, several shards), a `tuned` copy (init + noise) and
the kinfolk delta between them, then times each implementation of `init + 1.0 · delta` in its own subprocess
(wall time and peak RSS from `wait4`): one untimed round whose outputs are checked against each other (it also warms
the page cache), then `--repeats` rounds in which the implementations take turns (bench/timing.py). Each time ratio is
the median of the per-round ratios with their interquartile range as its spread ("undecided" while it straddles the
goal); memory figures are those of each implementation's fastest run:

- kinfolk:  `kinfolk merge apply-delta` (streamed, sharded, atomic, provenance hashed);
- naive:    every tensor of both inputs loaded, summed, written with the same shard grouping;
- mergekit: `mergekit-yaml` task_arithmetic with base_model = init and model = tuned at weight 1 (the same
            bytes in and out), when a `mergekit-yaml` executable is found (`--mergekit-bin`, or on PATH).

Peak RSS includes the interpreter and its imports; the memory goal is on the merge's own share, i.e. the peak
minus the peak of the same command with `--dry-run` (same imports, headers read, nothing written), against
3 × the largest tensor + one output shard. Outputs are checked against each other, the generated GBs deleted.
Ends with one JSON line.

    python bench/bench_merge.py [--size-gb 1.0] [--repeats 3] [--mergekit-bin /path/to/mergekit-yaml]

mergekit is not a kinfolk dependency; install it in a throwaway venv (`python -m venv /tmp/mk &&
/tmp/mk/bin/pip install mergekit`) and pass `--mergekit-bin /tmp/mk/bin/mergekit-yaml`.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from timing import Spread, interleaved, paired_ratio, report

from kinfolk.tensors import INDEX_FILE, ShardedWriter, TensorReader

HIDDEN, INTERMEDIATE, VOCAB = 2048, 5632, 32000
SHARD_BYTES = 300 * 1000**2


def llama_config(num_layers: int) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": num_layers,
        "num_attention_heads": 16,
        "num_key_value_heads": 16,
        "vocab_size": VOCAB,
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False,
        "dtype": "float32",
    }


def layer_shapes(num_layers: int) -> dict[str, tuple[int, ...]]:
    shapes = {
        "model.embed_tokens.weight": (VOCAB, HIDDEN),
        "model.norm.weight": (HIDDEN,),
        "lm_head.weight": (VOCAB, HIDDEN),
    }
    for layer in range(num_layers):
        prefix = f"model.layers.{layer}"
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            shapes[f"{prefix}.self_attn.{name}.weight"] = (HIDDEN, HIDDEN)
        shapes[f"{prefix}.mlp.gate_proj.weight"] = (INTERMEDIATE, HIDDEN)
        shapes[f"{prefix}.mlp.up_proj.weight"] = (INTERMEDIATE, HIDDEN)
        shapes[f"{prefix}.mlp.down_proj.weight"] = (HIDDEN, INTERMEDIATE)
        shapes[f"{prefix}.input_layernorm.weight"] = (HIDDEN,)
        shapes[f"{prefix}.post_attention_layernorm.weight"] = (HIDDEN,)
    return shapes


def write_model(directory: Path, num_layers: int, seed: int, base: Path | None = None) -> None:
    """A random model, or (with `base`) base + small noise, in ~300 MB shards via kinfolk's writer."""
    generator = torch.Generator().manual_seed(seed)
    reader = TensorReader(base) if base else None
    with ShardedWriter(directory, SHARD_BYTES) as writer:
        for name, shape in layer_shapes(num_layers).items():
            tensor = torch.randn(shape, generator=generator) * (0.01 if reader else 0.02)
            writer.add(name, tensor + reader.get(name) if reader else tensor)
    (directory / "config.json").write_text(json.dumps(llama_config(num_layers)))


def naive_apply_delta(init: Path, delta: Path, out: Path) -> None:
    """Load everything, add, write with the init's shard grouping: what a short script would do."""
    index = json.loads((init / INDEX_FILE).read_text())["weight_map"]
    base, change = {}, {}
    for file in sorted(set(index.values())):
        base.update(load_file(init / file))
    for file in sorted({path.name for path in delta.glob("*.safetensors")}):
        change.update(load_file(delta / file))
    merged = {name: base[name] + change[name] for name in base}
    out.mkdir()
    for file in sorted(set(index.values())):
        save_file({name: merged[name] for name, f in index.items() if f == file}, out / file, {"format": "pt"})
    (out / INDEX_FILE).write_text((init / INDEX_FILE).read_text())
    shutil.copyfile(init / "config.json", out / "config.json")


# Linux charges a child with its parent's resident set at fork, so each command is started by this small
# interpreter (no site, no torch) rather than by the bench process, which holds generated tensors.
_LAUNCHER = """
import json, os, subprocess, sys, tempfile, time
with tempfile.TemporaryFile() as log:
    start = time.perf_counter()
    child = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=log)
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - start
    log.seek(0)
    tail = log.read()[-2000:].decode(errors="replace")
print(json.dumps({"wall_s": wall, "peak_rss_kb": usage.ru_maxrss, "rc": os.waitstatus_to_exitcode(status), "tail": tail}))
"""


def measure(command: list[str]) -> dict:
    """Wall time and peak RSS of one command in its own process (wait4 gives that child's maximum resident set)."""
    launched = subprocess.run([sys.executable, "-S", "-c", _LAUNCHER, *command], capture_output=True, text=True)
    result = json.loads(launched.stdout)
    if result["rc"] != 0:
        raise RuntimeError(f"{command[:4]} failed:\n{result['tail']}")
    return {"wall_s": round(result["wall_s"], 2), "peak_rss_mb": round(result["peak_rss_kb"] / 1024, 1)}


def max_abs_difference(left: Path, right: Path) -> float:
    a, b = TensorReader(left), TensorReader(right)
    if a.names() != b.names():
        raise AssertionError(f"tensor names differ between {left} and {right}")
    return max(float((a.get(name) - b.get(name)).abs().max()) for name in a.names())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-gb", type=float, default=1.0, help="least size of the generated checkpoint")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workdir", default=None, help="where to generate (default: a temporary directory)")
    parser.add_argument("--mergekit-bin", default=shutil.which("mergekit-yaml"))
    parser.add_argument("--naive", nargs=3, metavar=("INIT", "DELTA", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.naive:
        naive_apply_delta(*map(Path, args.naive))
        return 0

    root = Path(tempfile.mkdtemp(prefix="bench-merge-", dir=args.workdir))
    python = sys.executable
    try:
        num_layers = 1
        while sum(_numel(s) for s in layer_shapes(num_layers).values()) * 4 < args.size_gb * 1e9:
            num_layers += 1
        shapes = layer_shapes(num_layers)
        largest = max(_numel(shape) for shape in shapes.values()) * 4
        write_model(root / "init", num_layers, seed=0)
        write_model(root / "tuned", num_layers, seed=1, base=root / "init")
        (root / "delta.yaml").write_text(
            f"init: {root / 'init'}\ndistilled: {root / 'tuned'}\nmax_shard_size: {SHARD_BYTES}\n"
        )
        kinfolk = [python, "-m", "kinfolk", "merge"]
        subprocess.run(
            [*kinfolk, "delta", str(root / "delta.yaml"), "--out", str(root / "delta"), "--no-progress"],
            check=True,
            capture_output=True,
        )
        apply_config = root / "apply.yaml"
        apply_config.write_text(f"init: {root / 'init'}\ndelta: {root / 'delta'}\nmax_shard_size: {SHARD_BYTES}\n")
        mergekit_config = root / "mergekit.yml"
        mergekit_config.write_text(
            f"merge_method: task_arithmetic\nbase_model: {root / 'init'}\nmodels:\n"
            f"  - model: {root / 'tuned'}\n    parameters:\n      weight: 1.0\n"
            "parameters:\n  normalize: false\ndtype: float32\nout_dtype: float32\n"
        )
        commands = {
            "kinfolk": lambda out: [*kinfolk, "apply-delta", str(apply_config), "--out", str(out), "--no-progress"],
            "naive": lambda out: [python, __file__, "--naive", str(root / "init"), str(root / "delta"), str(out)],
        }
        if args.mergekit_bin:
            commands["mergekit"] = lambda out: [
                args.mergekit_bin, str(mergekit_config), str(out), "--out-shard-size", f"{SHARD_BYTES // 4 // 10**6}M",  # parameters, fp32
                "--no-copy-tokenizer", "--no-write-model-card", "--lazy-unpickle", "--allow-crimes", "--quiet",
            ]  # fmt: skip
        checks = {}
        for name, command in commands.items():
            measure(command(root / f"out-{name}"))
            if name != "kinfolk":
                difference = max_abs_difference(root / "out-kinfolk", root / f"out-{name}")
                checks[f"max_abs_diff_kinfolk_vs_{name}"] = difference
        kinfolk_shards = (root / "out-kinfolk").glob("*.safetensors")
        output_shards = sorted(path.stat().st_size for path in kinfolk_shards)
        runs = {name: [] for name in commands}

        def timed_run(name: str):
            def run():
                shutil.rmtree(root / f"out-{name}", ignore_errors=True)
                runs[name].append(measure(commands[name](root / f"out-{name}")))
                print(f"{name}: {runs[name][-1]}", file=sys.stderr)

            return run

        # interleaved supplies the turns; the figures are the child's own wall time and peak RSS, from the launcher
        interleaved({name: timed_run(name) for name in commands}, args.repeats, warmup=0)
        for name in commands:
            shutil.rmtree(root / f"out-{name}")
        wall = {name: [run["wall_s"] for run in results] for name, results in runs.items()}
        baseline = measure([*kinfolk, "apply-delta", str(apply_config), "--dry-run"])
        best = {name: min(results, key=lambda run: run["wall_s"]) for name, results in runs.items()}
        merge_rss = max(run["peak_rss_mb"] for run in runs["kinfolk"]) - baseline["peak_rss_mb"]
        bound_mb = (3 * largest + output_shards[-1]) / 2**20
        input_bytes = sum(path.stat().st_size for path in (root / "init").glob("*.safetensors"))
        figures = {
            "checkpoint_gb": round(input_bytes / 1e9, 3),
            "input_shards": len(list((root / "init").glob("*.safetensors"))),
            "largest_tensor_mb": round(largest / 2**20, 1),
            "largest_output_shard_mb": round(output_shards[-1] / 2**20, 1),
            "memory_bound_mb": round(bound_mb, 1),
            "kinfolk_baseline_rss_mb": baseline["peak_rss_mb"],
            "kinfolk_dry_run_wall_s": baseline["wall_s"],  # interpreter, imports, plan: the fixed cost
            "kinfolk_merge_rss_mb": round(merge_rss, 1),
            **{f"{name}_{key}": value for name, run in best.items() for key, value in run.items()},
            "runs": runs,
            **checks,
        }
        spreads = {
            "rss_merge_vs_bound": Spread.exact(merge_rss / bound_mb),
            "time_vs_naive": paired_ratio(wall["kinfolk"], wall["naive"]),
            "rss_vs_naive": Spread.exact(best["kinfolk"]["peak_rss_mb"] / best["naive"]["peak_rss_mb"]),
            "max_abs_diff_kinfolk_vs_naive": Spread.exact(checks["max_abs_diff_kinfolk_vs_naive"]),
        }
        goals = {"rss_merge_vs_bound": "<= 1.0", "max_abs_diff_kinfolk_vs_naive": "<= 0"}
        if "mergekit" in best:
            spreads["time_vs_mergekit"] = paired_ratio(wall["kinfolk"], wall["mergekit"])
            spreads["rss_vs_mergekit"] = Spread.exact(best["kinfolk"]["peak_rss_mb"] / best["mergekit"]["peak_rss_mb"])
            goals["time_vs_mergekit"] = "<= 1.0"
        else:
            figures["mergekit"] = "not installed (pass --mergekit-bin)"
        print(json.dumps(report("merge_apply_delta", figures, spreads, goals)))
        return 0
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _numel(shape: tuple[int, ...]) -> int:
    count = 1
    for size in shape:
        count *= size
    return count


if __name__ == "__main__":
    sys.exit(main())
