"""Bad `kinfolk:` values and bad weight columns are refused in one line before any model loads."""

from __future__ import annotations

import pytest
from axolotl_helpers import alpaca_rows, config, load_config, load_data, write_config, write_rows
from pydantic import ValidationError

from kinfolk.errors import InputError, WeightColumnError


@pytest.fixture(scope="module")
def model_dir(tiny_kit):
    return tiny_kit.model_dir("llama")


def setup(tmp_path, model_dir, weights, kinfolk, **overrides):
    data = write_rows(tmp_path / "train.jsonl", alpaca_rows(weights))
    return write_config(tmp_path, config(tmp_path, model_dir, data, kinfolk=kinfolk, **overrides))


@pytest.mark.parametrize(
    ("kinfolk", "said"),
    [
        ({"weight_column": "weight", "weight_reduction": "mean"}, "kinfolk.weight_reduction='mean' is not one of"),
        ({"weight_colum": "weight"}, "weight_colum"),
        ({"weight_column": "weight", "weight_clip_min": 3, "weight_clip_max": 1}, "is larger than"),
        ({"retained_kl": {"every_n_steps": 5}}, "kinfolk.retained_kl measures on kinfolk.retained_dataset"),
        ({"retained_dataset": "r.jsonl", "retained_kl": {"cache": "disk"}}, "kinfolk.retained_kl.cache='disk'"),
        ({"atlas": {"residual": "wide"}}, "kinfolk.atlas.residual='wide'"),
    ],
)
def test_bad_values_in_the_yaml_are_refused_by_the_config_schema(tmp_path, model_dir, kinfolk, said):
    with pytest.raises(ValidationError) as raised:
        load_config(setup(tmp_path, model_dir, [1.0] * 8, kinfolk))
    assert said in str(raised.value)
    assert any(said in line for line in str(raised.value).splitlines())  # one line says it


@pytest.mark.parametrize(
    ("weights", "said"),
    [
        (
            [1.0, -0.5, 1.0, 1.0],
            "has 1 invalid value(s) (weights must be finite non-negative numbers) in rows 1 (-0.5)",
        ),
        ([1.0, None, 2.0, 1.0], "in rows 1 (None)"),
        ([0.0, 0.0, 0.0, 0.0], "every weight in the axolotl dataset's weight column 'weight' is 0"),
    ],
)
def test_bad_weights_are_refused_before_any_model_loads(tmp_path, model_dir, weights, said):
    cfg = load_config(setup(tmp_path, model_dir, weights, {"weight_column": "weight"}))
    with pytest.raises(WeightColumnError) as raised:
        load_data(cfg)
    assert said in str(raised.value) and "\n" not in str(raised.value)


def test_a_missing_weight_column_names_the_columns_present(tmp_path, model_dir):
    cfg = load_config(setup(tmp_path, model_dir, [1.0] * 4, {"weight_column": "score"}))
    with pytest.raises(WeightColumnError, match=r"has no weight column 'score'; columns present: \[.*'weight'\]"):
        load_data(cfg)


@pytest.mark.parametrize(
    ("overrides", "said"),
    [
        ({"sample_packing": True}, "sample_packing (packs rows through its own batch-sampler collator)"),
        ({"adapter": "atlas"}, "adapter: atlas fits its atlas on kinfolk.retained_dataset, which is not set"),
    ],
)
def test_settings_the_plugin_cannot_honour_are_refused(tmp_path, model_dir, overrides, said):
    cfg = load_config(setup(tmp_path, model_dir, [1.0] * 8, {"weight_column": "weight"}, **overrides))
    with pytest.raises(InputError) as raised:
        load_data(cfg)
    assert said in str(raised.value) and "\n" not in str(raised.value)
