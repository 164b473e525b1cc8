"""Starting a test's job under two CPU processes (gloo): `torchrun` for raw `torch.distributed` jobs,
`accelerate launch --multi_gpu` (with no GPU visible, two torchrun workers) for trainers and `kinfolk` verbs.

Both use a free port (`--standalone`, or accelerate's `--main_process_port 0`), one thread per process, no visible
GPU, and a generous timeout: the 2-process tests run beside other tests on two shared cores. `assert_same_gradients`
compares what the ranks computed with one process's gradients.

Inside a job, the group's set-up and release: `gloo_group()` for a raw `torch.distributed` job, `train_in_turn` for
a job that runs several trainings under one `accelerate launch`.
"""

from __future__ import annotations

import contextlib
import gc
import os
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TypeVar

import torch

from kinfolk.process_group import end_process_group, end_training

TIMEOUT = 900
# A job's two logged training steps on CPU, nothing saved on the way (a trainer config's fields)
TWO_CPU_STEPS = {
    "max_steps": 2, "per_device_train_batch_size": 4, "logging_steps": 1, "save_strategy": "no", "report_to": [],
    "seed": 0, "max_length": 64, "bf16": False, "use_cpu": True,
}  # fmt: skip
Run = TypeVar("Run")


def environment(*paths: Path, variables: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment for a job: one thread, no GPU, offline, `paths` importable, then `variables`."""
    launched = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", "TOKENIZERS_PARALLELISM": "false"}
    launched.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", OMP_WAIT_POLICY="PASSIVE")
    launched["PYTHONPATH"] = os.pathsep.join([*map(str, paths), launched.get("PYTHONPATH", "")])
    return launched | (variables or {})


def run(command: list[str], *paths: Path, variables: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    launched = environment(*paths, variables=variables)
    finished = subprocess.run(command, env=launched, capture_output=True, text=True, timeout=TIMEOUT)
    assert finished.returncode == 0, f"{finished.stdout[-2000:]}\n{finished.stderr[-6000:]}"
    return finished


def torchrun(script: Path, *arguments: str, variables: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(script)]
    return run([*command, *arguments], script.parent, variables=variables)


def accelerate_flags() -> list[str]:
    return ["--multi_gpu", "--num_processes", "2", "--main_process_port", "0"]


def accelerate(script: Path, *arguments: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "accelerate.commands.launch", *accelerate_flags(), str(script)]
    return run([*command, *arguments], script.parent)


def assert_same_gradients(sharded: dict, single: dict) -> None:
    assert sharded.keys() == single.keys() and single
    for name, grad in single.items():
        torch.testing.assert_close(sharded[name], grad, rtol=1e-5, atol=1e-7, msg=name)


@contextlib.contextmanager
def gloo_group() -> Iterator[tuple[int, int]]:
    """A raw `torch.distributed` job's process group, from torchrun's environment: (rank, world size) inside the
    block; once the block succeeds, every rank waits for the others and the group is destroyed before the
    interpreter exits (`kinfolk.process_group.end_process_group`)."""
    torch.distributed.init_process_group("gloo")
    yield torch.distributed.get_rank(), torch.distributed.get_world_size()
    end_process_group()


def train_in_turn(runs: Sequence[Run], train: Callable[[Run], object]) -> None:
    """`train(run)` (a finished `Trainer`) for each run in turn under one launch (a launch costs two interpreters with
    the whole stack), every run on the launcher's process group.

    Between runs each rank drops the finished trainer's DDP reducer while the group is alive, then waits for the
    other; after the last run, `end_training` tears gloo down on every rank before the interpreter would (exiting
    with the group alive can abort a rank at shutdown)."""
    for run in runs[:-1]:
        trainer = train(run)
        trainer.accelerator.free_memory()
        trainer.model_wrapped = trainer.model
        del trainer
        gc.collect()
        torch.distributed.barrier()
    end_training(train(runs[-1]))
