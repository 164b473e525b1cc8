"""`kinfolk sft --use_atlas` under two processes fits the atlas once across them: each process runs the model on
half of the retained rows, and the saved one-region atlas is the Global PCA of all of them, as one process fits it."""

import sys
from pathlib import Path

import pytest
import torch
from peft import PeftModel, get_peft_model
from sft_helpers import TINY_RUN
from transformers import AutoModelForCausalLM
from two_process_helpers import accelerate_flags, run

from kinfolk.plugins.atlas import AtlasConfig, fit_atlas
from kinfolk.testing import prompt_completion_dataset, text_dataset

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("two-processes")]
O_PROJ = "model.layers.0.self_attn.o_proj"


def test_the_atlas_is_fitted_once_across_processes(tiny_kit, tiny_tokenizer, tmp_path):
    (tmp_path / "target").mkdir()
    prompt_completion_dataset(8).add_column("weight", [1.0] * 8).to_json(tmp_path / "target" / "train.jsonl")
    text_dataset(10, seed=2).to_json(tmp_path / "retained.jsonl")
    model_dir = tiny_kit.model_dir("qwen3")
    command = [
        str(Path(sys.executable).with_name("kinfolk")), "sft",
        "--model_name_or_path", str(model_dir),
        "--dataset_name", str(tmp_path / "target"),
        "--output_dir", str(tmp_path / "out"),
        "--use_atlas", "--atlas_retained_dataset", str(tmp_path / "retained.jsonl"),
        "--atlas_layers", "0", "--atlas_r", "4", "--atlas_regions", "1", "--atlas_directions", "3",
        *TINY_RUN, *accelerate_flags(),
    ]  # fmt: skip
    finished = run(command)
    fitted = [line for line in finished.stdout.splitlines() if line.startswith("ATLAS: atlas fitted")]
    reference_model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(model_dir),
        AtlasConfig(r=4, num_regions=1, num_directions=3, layers_to_transform=[0], task_type="CAUSAL_LM"),
    )
    reference = fit_atlas(reference_model, text_dataset(10, seed=2), tokenizer=tiny_tokenizer, progress=False)
    # printed once (by the main process): the rows were split 5 + 5 and the tokens are all of them
    assert fitted == [
        f"ATLAS: atlas fitted on {reference.tokens} retained tokens across 2 processes (rows per process [5, 5])"
        + fitted[0][fitted[0].rindex(" in ") :]
    ], finished.stdout
    saved = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(model_dir), tmp_path / "out")
    layer, expected = (model.base_model.model.get_submodule(O_PROJ) for model in (saved, reference_model))
    for name in ("atlas_centers", "atlas_in_spectrum", "atlas_out_spectrum", "atlas_calibration"):
        torch.testing.assert_close(
            getattr(layer, name)["default"], getattr(expected, name)["default"], rtol=1e-5, atol=1e-6
        )
    cosines = (layer.atlas_in_basis["default"][0] * expected.atlas_in_basis["default"][0]).sum(1).abs()
    torch.testing.assert_close(cosines, torch.ones_like(cosines), rtol=0, atol=1e-4)
