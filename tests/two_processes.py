"""Starting a test's job under two CPU processes (gloo): `torchrun` for raw `torch.distributed` jobs,
`accelerate launch --multi_gpu` (with no GPU visible, two torchrun workers) for trainers and `kinfolk` verbs.

Both use a free port (`--standalone`, or accelerate's `--main_process_port 0`), one thread per process, no visible
GPU, and a generous timeout: the 2-process tests run beside other tests on two shared cores. `assert_same_gradients`
compares what the ranks computed with one process's gradients.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

TIMEOUT = 900


def environment(*paths: Path) -> dict[str, str]:
    variables = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", "TOKENIZERS_PARALLELISM": "false"}
    variables.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", OMP_WAIT_POLICY="PASSIVE")
    variables["PYTHONPATH"] = os.pathsep.join([*map(str, paths), variables.get("PYTHONPATH", "")])
    return variables


def run(command: list[str], *paths: Path) -> subprocess.CompletedProcess:
    finished = subprocess.run(command, env=environment(*paths), capture_output=True, text=True, timeout=TIMEOUT)
    assert finished.returncode == 0, f"{finished.stdout[-2000:]}\n{finished.stderr[-6000:]}"
    return finished


def torchrun(script: Path, *arguments: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(script)]
    return run([*command, *arguments], script.parent)


def accelerate_flags() -> list[str]:
    return ["--multi_gpu", "--num_processes", "2", "--main_process_port", "0"]


def accelerate(script: Path, *arguments: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "accelerate.commands.launch", *accelerate_flags(), str(script)]
    return run([*command, *arguments], script.parent)


def assert_same_gradients(sharded: dict, single: dict) -> None:
    assert sharded.keys() == single.keys() and single
    for name, grad in single.items():
        torch.testing.assert_close(sharded[name], grad, rtol=1e-5, atol=1e-7, msg=name)
