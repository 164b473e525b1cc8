"""WeightedSFTTrainer against TRL's option surface: each option keeps the weights or is refused at construction.

"Honoured" is shown by training, as a user trains: identity with `SFTTrainer` at w ≡ 1 and doubling of one SGD step
(tests/weighted_sft_options_helpers.py states both). `OPTIONS` there is the registry behind the option table in
docs/atlantis.md; `test_the_docs_table_is_the_registry` keeps the two equal, row for row
(`python tests/weighted_sft_options_helpers.py` prints the table). The trainer arguments `compute_loss_func` and a
custom `data_collator` are refused too (tests/test_weighted_sft.py).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from sft_helpers import assert_same_tensors, batch_loss_and_grads, sft_trainer, weighted_trainer
from weighted_sft_options_helpers import (
    ALONE,
    BY_NAME,
    HALF,
    OPTIONS,
    ROWS,
    TRAINED,
    assert_identity_and_doubling,
    rows,
)

from kinfolk.compat.trl import FUSED_KERNELS

DOCS = Path(__file__).resolve().parents[1] / "docs" / "atlantis.md"


@pytest.mark.slow
@pytest.mark.parametrize("name", TRAINED)
def test_an_option_that_keeps_the_weights(tiny_tokenizer, tmp_path, name):
    assert_identity_and_doubling(tiny_tokenizer, tmp_path, BY_NAME[name])


@pytest.mark.skipif(FUSED_KERNELS, reason="TRL >= 1.15 keeps its fused head under liger (the test below)")
def test_liger_is_refused_on_trl_1_14_whose_sft_trainer_takes_liger_s_loss(tiny_tokenizer, tmp_path):
    option = BY_NAME["use_liger_kernel=True"]
    with pytest.raises(ValueError, match=r"use_liger_kernel=True. on TRL < 1\.15: liger's fused_linear_cross_entropy"):
        weighted_trainer(tiny_tokenizer, rows(option.data, [1.0] * ROWS), tmp_path, **option.options)


@pytest.mark.skipif(not FUSED_KERNELS, reason="TRL 1.14 takes liger's loss: refused (the test above)")
def test_liger_keeps_the_fused_head_whose_log_probs_carry_the_weights(tiny_tokenizer, tmp_path):
    """On CPU liger-kernel cannot run (Triton); what kinfolk relies on is checked on the loss it computes."""
    option = BY_NAME["use_liger_kernel=True"]
    ours = weighted_trainer(tiny_tokenizer, rows(option.data, [1.0] * ROWS), tmp_path / "w", **option.options)
    assert ours.args.liger_kernel_config == {"fused_linear_cross_entropy": False}
    theirs = sft_trainer(tiny_tokenizer, rows(option.data, None), tmp_path / "s")
    loss, grads = batch_loss_and_grads(ours)
    expected_loss, expected_grads = batch_loss_and_grads(theirs)
    assert torch.equal(loss, expected_loss)
    assert_same_tensors(grads, expected_grads)
    # with weight_reduction='sequence' (D = examples) the loss is linear in the weights, batch by batch
    losses = {}
    for label, weights in {"one": [1.0] * ROWS, "half": HALF, "alone": ALONE}.items():
        trainer = weighted_trainer(
            tiny_tokenizer, rows(option.data, weights), tmp_path / label, weight_reduction="sequence", **option.options
        )
        losses[label] = batch_loss_and_grads(trainer)
    torch.testing.assert_close(losses["half"][0], losses["one"][0] + losses["alone"][0])
    summed = {name: losses["one"][1][name] + losses["alone"][1][name] for name in losses["one"][1]}
    assert_same_tensors(losses["half"][1], summed, rel=1e-5)


@pytest.mark.parametrize("name", [o.name for o in OPTIONS if o.status == "refused"])
def test_an_option_that_would_lose_the_weights_is_refused_by_name(tiny_tokenizer, tmp_path, name):
    option = BY_NAME[name]
    with pytest.raises(ValueError, match=option.refusal):
        weighted_trainer(tiny_tokenizer, rows(option.data, [1.0] * ROWS), tmp_path, **option.options)


def test_activation_offloading_fails_in_trl_on_cpu(tiny_tokenizer, tmp_path):
    """Its row says "GPU check" because TRL cannot build its offloading context without an accelerator device; if
    this starts to pass on CPU, the row should become a trained identity-and-doubling test. A CUDA build of torch
    (PyPI's, on Python 3.12 / 3.13) fails in the CUDA runtime instead of on the missing device's attribute."""
    option = BY_NAME["activation_offloading=True"]
    assert not torch.cuda.is_available()
    with pytest.raises(torch.AcceleratorError if torch.version.cuda else AttributeError):
        weighted_trainer(tiny_tokenizer, rows(option.data, [1.0] * ROWS), tmp_path, **option.options)


def documented_rows() -> list[tuple[str, str, str]]:
    text = DOCS.read_text()
    table = text[text.index("<!-- option-table -->") : text.index("<!-- /option-table -->")]
    lines = [line.strip() for line in table.splitlines()[3:] if line.startswith("|")]
    return [tuple(cell.strip() for cell in line.strip("|").split("|")) for line in lines]


def test_the_docs_table_is_the_registry():
    def plain(text: str) -> str:
        return re.sub(r"[`*]", "", text)

    assert [(plain(n), s, plain(e)) for n, s, e in documented_rows()] == [
        (o.name, o.status, plain(o.evidence)) for o in OPTIONS
    ]
