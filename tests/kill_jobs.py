"""Jobs that the kill tests run in a subprocess and SIGKILL at a chosen point (`test_kill_and_resume.py`).

    python kill_jobs.py JOB ARGS.json [--kill MODULE:ATTR WHEN N [MATCH]] [--no-exchange]
    python kill_jobs.py JOB ARGS.json --signal SIGTERM|SIGINT MODULE:ATTR WHEN N [MATCH]

The kill point wraps a function (`kinfolk.atomic:exchange`, `kinfolk.tensors:ShardedWriter._flush`,
`pathlib:Path.rename`, ...) so that its N-th call (counting only calls whose first argument's text ends with
MATCH, if given: any positional argument's text ending so) is followed (WHEN = after) or preceded (WHEN = before) by SIGKILL of this very process: no
`finally`, no atexit, exactly what a power cut or the OOM killer leaves. `--signal` sends that signal instead (what a scheduler or
Ctrl-C sends: the process handles it). `--no-exchange` takes the platform's atomic exchange away, to test the
fallback overwrite. Jobs:

- `merge`: `kinfolk merge OP CONFIG.yaml --out OUT [--all] [--overwrite]` (the command line, in this process).
- `score`: `kinfolk score --data DATA --large_base ... --cache_dir CACHE --out OUT [--option value ...]` (the same).
- `compare`: `kinfolk compare ARGV` (the command line, in this process).
- `sft`: a `WeightedSFTTrainer` run with checkpoints every 2 steps (resumed from the last checkpoint with
  `resume: true`), its final parameters saved to `out`; runs under `accelerate launch` too.
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import sys
from pathlib import Path


def install_kill(target: str, when: str, count: int, match: str | None, signum: int = signal.SIGKILL) -> None:
    module_name, attribute = target.split(":")
    owner = importlib.import_module(module_name)
    *path, name = attribute.split(".")
    for part in path:
        owner = getattr(owner, part)
    real = getattr(owner, name)
    calls = 0

    def killing(*args, **kwargs):
        nonlocal calls
        counted = match is None or any(str(argument).endswith(match) for argument in args)
        calls += bool(counted)
        if counted and calls == count and when == "before":
            os.kill(os.getpid(), signum)
        result = real(*args, **kwargs)
        if counted and calls == count and when == "after":
            os.kill(os.getpid(), signum)
        return result

    setattr(owner, name, killing)


def command(argv: list[str]) -> None:
    """`kinfolk ARGV` in this process; a non-zero exit code is this job's."""
    from kinfolk.commands import main

    status = main([str(argument) for argument in argv])
    if status:
        sys.exit(status)


def merge_job(args: dict) -> None:
    config = Path(args["out"]).with_name("merge-config.yaml")
    config.write_text(json.dumps(args["config"]))  # JSON is YAML
    flags = ["--all"] * args["all_sizes"] + ["--overwrite"] * args["overwrite"]
    command(["merge", args["config"]["op"], config, "--out", args["out"], "--no-progress", *flags])


def score_job(args: dict) -> None:
    models = [item for role, path in args["models"].items() for item in (f"--{role}", path)]
    options = [item for name, value in args.get("options", {}).items() for item in (f"--{name}", value)]
    out = ["--out", args["out"], *["--overwrite"] * args["overwrite"]]
    command(["score", "--data", args["data"], *models, "--cache_dir", args["cache_dir"], *options, *out])


def compare_job(args: dict) -> None:
    command(["compare", *args["argv"]])


def sft_job(args: dict) -> None:
    import torch
    from sft_helpers import parameters, weighted_data, weighted_trainer

    from kinfolk.atomic import atomic_file
    from kinfolk.process_group import end_training
    from kinfolk.testing import build_tokenizer

    trainer = weighted_trainer(
        build_tokenizer(),
        weighted_data(16, [0.5 + (row % 3) for row in range(16)]),
        args["run_dir"],
        per_device_train_batch_size=2,
        max_steps=args["steps"],
        save_strategy="steps",
        save_steps=2,
        optim="adamw_torch",
        learning_rate=1e-3,
    )
    trainer.train(resume_from_checkpoint=True if args.get("resume") else None)
    if trainer.accelerator.is_main_process:
        with atomic_file(args["out"], mode="wb") as handle:
            torch.save({"parameters": parameters(trainer.model), "step": trainer.state.global_step}, handle)
    end_training(trainer)  # under 2 processes: no rank left in gloo's teardown (kinfolk.process_group)


JOBS = {"merge": merge_job, "score": score_job, "compare": compare_job, "sft": sft_job}

if __name__ == "__main__":
    import torch

    torch.set_num_threads(1)  # the tests compare with runs in other processes: same reductions, same bits
    job, arguments, rest = sys.argv[1], json.loads(Path(sys.argv[2]).read_text()), sys.argv[3:]
    if "--no-exchange" in rest:
        import kinfolk.atomic

        kinfolk.atomic.exchange = lambda first, second: False
        rest.remove("--no-exchange")
    if rest and rest[0] == "--kill":
        install_kill(rest[1], rest[2], int(rest[3]), rest[4] if len(rest) > 4 else None)
    if rest and rest[0] == "--signal":
        number = signal.Signals[rest[1]]
        install_kill(rest[2], rest[3], int(rest[4]), rest[5] if len(rest) > 5 else None, number)
    JOBS[job](arguments)
