"""FSDP2 on CPU for the parts issue 28 scales out: `fit_atlas` on a sharded model (same data on every rank) gives one
process's Global PCA atlas, and `LayerDistillationTrainer.training_step` on a sharded student gives one process's
loss and gradients. See tests/fsdp2_scale_job.py."""

import sys
from pathlib import Path

import pytest
import torch
from two_process_helpers import assert_same_gradients, torchrun

JOB = Path(__file__).with_name("fsdp2_scale_job.py")
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("two-processes")]


@pytest.fixture(scope="module")
def sharded_and_single(distil_pair):
    teacher, student, root = distil_pair
    (root / "fsdp2").mkdir()
    torchrun(JOB, teacher, student, str(root / "fsdp2" / "out.pt"))
    sys.path.insert(0, str(JOB.parent))
    from fsdp2_scale_job import run

    return torch.load(root / "fsdp2" / "out.pt"), run(teacher, student, str(root / "single"), sharded=False)


def test_fit_atlas_on_a_sharded_model(sharded_and_single):
    sharded, single = sharded_and_single
    assert sharded["world_size"] == 2 and "atlas_error" not in sharded, sharded.get("atlas_error")
    assert sharded["atlas_rank_rows"] == [3, 4] and single["atlas_rank_rows"] == [7]
    assert sharded["atlas"].keys() == single["atlas"].keys() and sharded["atlas"]
    for name, expected in single["atlas"].items():
        got = sharded["atlas"][name]
        if "basis" in name:  # eigenvectors up to sign
            cosines = (got * expected).sum(-1).abs()
            torch.testing.assert_close(cosines, torch.ones_like(cosines), rtol=0, atol=1e-4, msg=name)
        else:
            torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-6, msg=name)


def test_distillation_training_step_on_a_sharded_student(sharded_and_single):
    sharded, single = sharded_and_single
    assert "distil_error" not in sharded, sharded.get("distil_error")
    assert sharded["distil_loss"] == pytest.approx(single["distil_loss"], rel=1e-5)
    assert_same_gradients(sharded["distil_grads"], single["distil_grads"])
