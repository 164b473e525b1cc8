"""ATLAS through `kinfolk sft`: the options parse from flags and YAML, the adapter is built, fitted and saved."""

from pathlib import Path

import pytest
import torch
from peft import PeftModel
from safetensors import safe_open
from sft_helpers import TINY_RUN
from transformers import AutoModelForCausalLM

from kinfolk.commands import sft as sft_cli
from kinfolk.commands.sft_atlas_options import AtlasArguments
from kinfolk.testing import prompt_completion_dataset, text_dataset

ROOT = Path(__file__).resolve().parents[1]


def atlas_options(parsed) -> AtlasArguments:
    return next(options for options in parsed if isinstance(options, AtlasArguments))


def test_the_example_yaml_parses_into_the_papers_setup(tmp_path):
    parsed = sft_cli.make_parser().parse_args_and_config(
        ["--config", str(ROOT / "examples" / "sft_atlas.yaml"), "--output_dir", str(tmp_path), "--use_cpu"]
    )
    config = sft_cli.build_peft_config(parsed[2], parsed[4:])
    assert (config.peft_type.value, config.layers_to_transform, config.r, config.residual) == (
        "ATLAS",
        [17],
        16,
        "atlas",
    )
    assert atlas_options(parsed).atlas_retained_samples == 2048
    assert parsed[1].weight_column is None  # plain SFT data; ATLANTIS weights combine by naming their column


def test_an_atlas_run_is_one_command(tiny_kit, tmp_path):
    (tmp_path / "target").mkdir()
    prompt_completion_dataset(8).add_column("weight", [1.0] * 8).to_json(tmp_path / "target" / "train.jsonl")
    text_dataset(10, seed=2).to_json(tmp_path / "retained.jsonl")
    argv = [
        "--model_name_or_path", str(tiny_kit.model_dir("qwen3")),
        "--dataset_name", str(tmp_path / "target"),
        "--output_dir", str(tmp_path / "out"),
        "--use_atlas", "--atlas_retained_dataset", str(tmp_path / "retained.jsonl"),
        "--atlas_layers", "0", "--atlas_r", "4", "--atlas_regions", "2", "--atlas_residual", "input_filter",
        *TINY_RUN,
    ]  # fmt: skip
    trainer = sft_cli.train(*sft_cli.make_parser().parse_args_and_config(argv))
    config = trainer.model.peft_config["default"]
    assert (config.peft_type.value, config.residual, config.layers_to_transform) == ("ATLAS", "input_filter", [0])
    with safe_open(tmp_path / "out" / "adapter_model.safetensors", "pt") as f:
        spectrum = f.get_tensor("base_model.model.model.layers.0.self_attn.o_proj.atlas_in_spectrum")
    assert spectrum[:, :-1].min() > 0  # the atlas was fitted (an unfitted one has zero variances)
    loaded = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(tiny_kit.model_dir("qwen3")), tmp_path / "out"
    )
    ids = torch.tensor([[3, 17, 29]])
    trainer.model.eval()
    assert torch.equal(loaded(ids).logits, trainer.model(ids).logits.cpu())


def test_atlas_shares_the_replay_retained_data_or_asks_for_some(tiny_kit, tmp_path):
    (tmp_path / "target").mkdir()
    prompt_completion_dataset(8).add_column("weight", [1.0] * 8).to_json(tmp_path / "target" / "train.jsonl")
    text_dataset(10, seed=2).to_json(tmp_path / "retained.jsonl")
    base = [
        "--model_name_or_path", str(tiny_kit.model_dir("llama")),
        "--dataset_name", str(tmp_path / "target"),
        "--output_dir", str(tmp_path / "out"),
        "--use_atlas", "--atlas_regions", "2", *TINY_RUN,
    ]  # fmt: skip
    with pytest.raises(ValueError, match="needs retained data"):
        sft_cli.train(*sft_cli.make_parser().parse_args_and_config(base))
    trainer = sft_cli.train(
        *sft_cli.make_parser().parse_args_and_config(
            [*base, "--retained_dataset_name", str(tmp_path / "retained.jsonl")]
        )
    )
    layer = trainer.model.base_model.model.model.layers[1].self_attn.o_proj
    assert layer.atlas_in_spectrum["default"][:, :-1].min() > 0  # fitted on the Replay/Output-KL retained data


def test_atlas_is_one_adapter_source(tiny_kit, tmp_path):
    parsed = sft_cli.make_parser().parse_args_and_config(
        ["--output_dir", str(tmp_path), "--use_atlas", "--atlas_retained_dataset", "r.jsonl", "--use_peft", *TINY_RUN]
    )
    with pytest.raises(ValueError, match="several adapters"):
        sft_cli.build_peft_config(parsed[2], parsed[4:])
