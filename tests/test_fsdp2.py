"""FSDP2 on CPU: an ATLAS adapter, the weighted SFT loss and the retained-KL measurement give, sharded over two
processes with `fully_shard` (gloo), the loss and gradients of one process. See tests/fsdp2_job.py."""

import sys
from pathlib import Path

import pytest
import torch
from two_process_helpers import assert_same_gradients, torchrun

JOB = Path(__file__).with_name("fsdp2_job.py")
pytestmark = pytest.mark.xdist_group("two-processes")  # one 2-process job at a time


@pytest.fixture(scope="module")
def sharded_and_single(atlas_adapter, tmp_path_factory):
    root = tmp_path_factory.mktemp("fsdp2")
    base_dir, adapter_dir = atlas_adapter["base"], atlas_adapter["adapter"]
    (root / "sharded").mkdir()
    torchrun(JOB, str(base_dir), str(adapter_dir), str(root / "sharded" / "out.pt"))
    sys.path.insert(0, str(JOB.parent))
    from fsdp2_job import run

    single = run(str(base_dir), str(adapter_dir), str(root / "single"), sharded=False)
    return torch.load(root / "sharded" / "out.pt"), single


def test_atlas_adapter_forward_and_backward(sharded_and_single):
    sharded, single = sharded_and_single
    assert sharded["world_size"] == 2
    assert sharded["atlas_loss"] == pytest.approx(single["atlas_loss"], rel=1e-6)
    assert sorted(name.split(".")[-2] for name in single["atlas_grads"]) == ["atlas_A", "atlas_B"]  # only A, B train
    assert_same_gradients(sharded["atlas_grads"], single["atlas_grads"])


def test_weighted_sft_loss_and_gradients(sharded_and_single):
    sharded, single = sharded_and_single
    assert sharded["sharded_parameters"] == len(single["weighted_grads"])  # every weight was a shard, and trained
    assert sharded["weighted_loss"] == pytest.approx(single["weighted_loss"], rel=1e-6)
    assert_same_gradients(sharded["weighted_grads"], single["weighted_grads"])


def test_retained_kl_measurement(sharded_and_single):
    sharded, single = sharded_and_single
    assert single["retained_kl"] > 1e-4  # the random adapter moves the model
    assert sharded["retained_kl"] == pytest.approx(single["retained_kl"], rel=1e-6)


def test_target_metric_measurement(sharded_and_single):
    sharded, single = sharded_and_single
    assert single["target"] < 0  # minus an NLL
    assert sharded["target"] == pytest.approx(single["target"], rel=1e-6)
