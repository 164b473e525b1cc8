"""`fit_atlas` under two gloo processes, each given the same data as a trainer is: the ranks split the rows (7 rows
as 3 + 4; one row leaves rank 0 with none), pool the k-means and PCA sums, and end with one bit-identical atlas that
is as good as one process's on all the rows. See tests/atlas_fit_ddp_job.py."""

import sys
from pathlib import Path

import pytest
import torch
from two_process_helpers import torchrun

from kinfolk.plugins.atlas.kmeans import inertia, nearest

JOB = Path(__file__).with_name("atlas_fit_ddp_job.py")
sys.path.insert(0, str(JOB.parent))
from atlas_fit_ddp_job import CASES, fit_case, inputs_of  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("two-processes")]


@pytest.fixture(scope="module")
def fits(tiny_kit, tmp_path_factory):
    model_dir = str(tiny_kit.model_dir("qwen3"))
    out = tmp_path_factory.mktemp("atlas-fit-ddp")
    torchrun(JOB, model_dir, str(out))
    ranks = [torch.load(out / f"rank{rank}.pt") for rank in (0, 1)]
    single = {name: fit_case(name, model_dir) for name in CASES}
    return model_dir, ranks, single


def agreement_up_to_relabelling(labels: torch.Tensor, reference: torch.Tensor, k: int) -> float:
    """Fraction of rows on which two labellings agree once each label is mapped to its most frequent partner."""
    table = torch.zeros(k, k, dtype=torch.int64).index_put_(
        (labels, reference), torch.ones_like(labels), accumulate=True
    )
    return float(table.max(1).values.sum()) / labels.shape[0]


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_rank_holds_the_same_atlas_and_ran_its_share_of_the_rows(fits, name):
    _, ranks, single = fits
    assert ranks[0]["world_size"] == 2
    for key, tensor in ranks[0][name]["atlas"].items():
        assert torch.equal(tensor, ranks[1][name]["atlas"][key]), key
    rank_rows = ranks[0][name]["rank_rows"]
    assert rank_rows == ranks[1][name]["rank_rows"]
    # each rank's first pass ran the model on exactly its share, and the shares are the data
    assert [ranks[r][name]["forward_rows_first_pass"] for r in (0, 1)] == rank_rows
    assert sum(rank_rows) == single[name]["forward_rows_first_pass"]
    assert max(rank_rows) - min(rank_rows) <= {"mlp_blobs": 30}.get(name, 1)  # batches of 30 rows
    assert ranks[0][name]["tokens"] == single[name]["tokens"] == sum(ranks[0][name]["region_tokens"])


def test_ranks_given_their_own_shares_fit_the_same_atlas(fits):
    """split_across_ranks=False (data already sharded, e.g. by accelerate): the same blocks, the same atlas."""
    _, ranks, _ = fits
    for record in ranks:
        shared, own = record["lm_regions"], record["lm_regions_own_share"]
        assert own["rank_rows"] == shared["rank_rows"] == [3, 4]
        for key, tensor in shared["atlas"].items():
            assert torch.equal(own["atlas"][key], tensor), key


def test_a_rank_without_rows_still_gives_global_pca(fits):
    _, ranks, single = fits
    assert ranks[0]["lm_one_row"]["rank_rows"] == [0, 1]
    atlas, reference = ranks[0]["lm_one_row"]["atlas"], single["lm_one_row"]["atlas"]
    for key in ("centers", "in_spectrum", "out_spectrum", "calibration"):
        torch.testing.assert_close(atlas[key], reference[key], rtol=1e-5, atol=1e-6, msg=key)
    for key in ("in_basis", "out_basis"):  # eigenvectors up to sign
        cosines = (atlas[key][0] * reference[key][0]).sum(1).abs()
        torch.testing.assert_close(cosines, torch.ones_like(cosines), rtol=0, atol=1e-4)


@pytest.mark.parametrize("name", ["lm_regions", "mlp_blobs"])
def test_the_pooled_fit_is_as_good_as_one_process_on_all_rows(fits, name):
    """Against the median of five one-process fits (seeds 0-4): on structureless activations one process's own
    optimum moves with the seed (lm_regions: inertias within ±20 % of the pooled fit's), so one seed's fit would
    make the comparison a coin toss; the pooled fit must be at least as good as a typical one."""
    model_dir, ranks, single = fits
    pooled = ranks[0][name]["atlas"]["centers"]
    rows = inputs_of(name, model_dir)
    assert rows.shape[0] == single[name]["tokens"]
    one_process = sorted(inertia(rows, fit_case(name, model_dir, seed=seed)["atlas"]["centers"]) for seed in range(5))
    ratio = inertia(rows, pooled) / one_process[2]
    assert ratio < 1.01, (ratio, one_process)


def test_separated_regions_route_held_out_points_as_one_process_does(fits):
    """Routing is compared where k-means has one optimum: on the tiny model's structureless activations two
    one-process fits with different seeds already route 10-18 % of held-out tokens differently."""
    model_dir, ranks, single = fits
    held_out = inputs_of("mlp_blobs", model_dir, seed=1)
    pooled, reference = ranks[0]["mlp_blobs"]["atlas"]["centers"], single["mlp_blobs"]["atlas"]["centers"]
    labels, expected = nearest(held_out, pooled), nearest(held_out, reference)
    assert agreement_up_to_relabelling(labels, expected, 3) == 1.0
    assert sorted(set(labels.tolist())) == [0, 1, 2]
