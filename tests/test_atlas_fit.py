"""Streamed k-means and `fit_atlas`, checked against direct computations on the collected activations."""

import warnings

import pytest
import torch
from peft import PeftModel, get_peft_model
from torch import nn
from transformers import AutoModelForCausalLM

from kinfolk.logprobs import pad_right
from kinfolk.plugins.atlas import AtlasConfig, fit_atlas
from kinfolk.plugins.atlas.fit import top_directions
from kinfolk.plugins.atlas.kmeans import StreamedKMeans, inertia, kmeans_plus_plus, nearest
from kinfolk.testing import conversational_dataset, prompt_completion_dataset, text_dataset
from kinfolk.tokens import sft_tokenize

O_PROJ = "model.layers.{}.self_attn.o_proj"


def run(km, rows, batch=64):
    snapshots = []
    while not km.done:
        snapshots.append(None if km.centers is None else km.centers.clone())
        for chunk in rows.split(batch):
            km.observe(chunk)
        km.end_pass()
    return snapshots


def blobs(seed=0, offset=0.0):
    g = torch.Generator().manual_seed(seed)
    means = torch.tensor([[8.0, 0, 0, 0], [0, 8.0, 0, 0], [0, 0, 8.0, 0]]) + offset
    rows = torch.cat([torch.randn(300, 4, generator=g) * torch.tensor([2.0, 1, 0.5, 0.2]) + m for m in means])
    return rows[torch.randperm(900, generator=g)], means


def test_kmeans_recovers_separated_regions():
    rows, means = blobs()
    km = StreamedKMeans(3, seed=0)
    run(km, rows)
    order = nearest(means, km.centers)
    assert sorted(order.tolist()) == [0, 1, 2]
    torch.testing.assert_close(km.centers[order], means, atol=0.3, rtol=0)
    assert km.counts.tolist() == [300.0, 300.0, 300.0]


def test_last_lloyd_pass_gives_exact_region_means_and_covariances():
    rows, _ = blobs(1)
    km = StreamedKMeans(4, seed=3, minibatch_epochs=1, lloyd_passes=2)
    before_last = run(km, rows)[-1]
    labels = nearest(rows, before_last)
    for k in range(4):
        part = rows[labels == k].double()
        torch.testing.assert_close(km.centers[k].double(), part.mean(0), rtol=0, atol=1e-5)
        torch.testing.assert_close(km.covariances[k].double(), torch.cov(part.T, correction=0), rtol=0, atol=1e-4)
        assert km.counts[k] == part.shape[0]


def test_covariances_stay_accurate_far_from_the_origin():
    rows, _ = blobs(2, offset=1e4)
    km = StreamedKMeans(3, seed=0)
    run(km, rows)
    labels = nearest(rows, km.centers)
    for k in range(3):
        part = rows[labels == k].double()
        # float32 rows 1e4 from the origin: only the shifted accumulation keeps the covariance near exact
        torch.testing.assert_close(km.covariances[k].double(), torch.cov(part.T, correction=0), rtol=0, atol=0.05)


def test_kmeans_plus_plus_spreads_seeds_and_kmeans_improves_on_them():
    rows, _ = blobs(4)
    seeds = kmeans_plus_plus(rows, 3, torch.Generator().manual_seed(0))
    assert len({int(i) for i in nearest(seeds, blobs(4)[1])}) == 3
    km = StreamedKMeans(3, seed=0)
    run(km, rows)
    assert inertia(rows, km.centers) <= inertia(rows, seeds)


def test_kmeans_needs_at_least_k_rows():
    km = StreamedKMeans(5)
    km.observe(torch.randn(3, 2))
    with pytest.raises(ValueError, match="at least 5 rows"):
        km.end_pass()


def test_top_directions_match_an_eigendecomposition():
    g = torch.Generator().manual_seed(0)
    basis, _ = torch.linalg.qr(torch.randn(6, 6, generator=g, dtype=torch.float64))
    variances = torch.tensor([9.0, 4.0, 1.0, 0.5, 0.3, 0.2], dtype=torch.float64)
    covariance = basis @ torch.diag(variances) @ basis.T
    directions, spectrum = top_directions(covariance.float(), 2)
    torch.testing.assert_close(
        spectrum.double(), torch.tensor([9.0, 4.0, 0.5], dtype=torch.float64), atol=1e-5, rtol=0
    )
    for j in range(2):  # each direction is ± the true eigenvector
        assert abs(float(directions[j].double() @ basis[:, j])) == pytest.approx(1.0, abs=1e-5)


def real_token_inputs(base, batches, layer, keep_key="attention_mask"):
    """Inputs of a decoder layer's o_proj on the real tokens, collected with a plain hook on the base model."""
    rows = []
    module = base.get_submodule(O_PROJ.format(layer))
    handle = module.register_forward_pre_hook(lambda m, args: rows.append(args[0]))
    with torch.no_grad():
        for batch in batches:
            rows[:0] = []
            base(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
            keep = batch[keep_key].bool() if keep_key == "attention_mask" else batch["labels"] != -100
            rows[-1] = rows[-1][keep & batch["attention_mask"].bool()]
    handle.remove()
    return torch.cat(rows).double()


def batches_of(dataset, tokenizer, size):
    tokens = sft_tokenize(dataset, tokenizer)
    ids, labels = tokens["input_ids"], tokens["labels"]
    return [
        pad_right(ids[i : i + size], labels[i : i + size], tokenizer.pad_token_id) for i in range(0, len(ids), size)
    ]


def assert_global_pca(layer, rows, p):
    """A one-region atlas is the mean and the top-p eigenvectors of all real-token inputs (Global PCA)."""
    mean = rows.mean(0)
    covariance = torch.cov(rows.T, correction=0)
    torch.testing.assert_close(layer.atlas_centers["default"][0].double(), mean, atol=1e-5, rtol=1e-5)
    values, vectors = torch.linalg.eigh(covariance)
    values, vectors = values.flip(0), vectors.flip(1)
    spectrum = layer.atlas_in_spectrum["default"][0].double()
    torch.testing.assert_close(spectrum[:p], values[:p], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(spectrum[p], values[p:].mean(), atol=1e-4, rtol=1e-4)
    for j in range(p):
        assert abs(float(layer.atlas_in_basis["default"][0, j].double() @ vectors[:, j])) == pytest.approx(1, abs=1e-3)
    # distance scale: mean squared distance to the (only) centre over the tokens = trace of the covariance
    assert float(layer.atlas_calibration["default"][1]) == pytest.approx(float(covariance.trace()), rel=1e-4)
    weight = layer.base_layer.weight.double()
    out_values = torch.linalg.eigvalsh(weight @ covariance @ weight.T).flip(0)
    torch.testing.assert_close(
        layer.atlas_out_spectrum["default"][0, :p].double(), out_values[:p], atol=1e-4, rtol=1e-4
    )


@pytest.mark.parametrize("make", [text_dataset, prompt_completion_dataset, conversational_dataset])
def test_one_region_atlas_is_global_pca_of_the_real_tokens(tiny_kit, tiny_tokenizer, make):
    path = tiny_kit.model_dir("qwen3")
    dataset = make(12)
    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(path), AtlasConfig(r=4, num_regions=1, num_directions=3)
    )
    report = fit_atlas(model, dataset, tokenizer=tiny_tokenizer, batch_size=5, progress=False)
    rows = real_token_inputs(AutoModelForCausalLM.from_pretrained(path), batches_of(dataset, tiny_tokenizer, 1), 1)
    assert report.tokens == rows.shape[0] and report.passes == 3
    layer = model.base_model.model.get_submodule(O_PROJ.format(1))
    assert_global_pca(layer, rows, 3)


def test_prompt_tokens_can_be_left_out(tiny_kit, tiny_tokenizer):
    path = tiny_kit.model_dir("llama")
    dataset = prompt_completion_dataset(10)
    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(path), AtlasConfig(r=4, num_regions=1, num_directions=2)
    )
    fit_atlas(model, dataset, tokenizer=tiny_tokenizer, mask_prompt=True, progress=False)
    base = AutoModelForCausalLM.from_pretrained(path)
    rows = real_token_inputs(base, batches_of(dataset, tiny_tokenizer, 3), 1, keep_key="labels")
    assert_global_pca(model.base_model.model.get_submodule(O_PROJ.format(1)), rows, 2)


def test_fit_runs_the_frozen_model_and_restores_its_state(tiny_kit, tiny_tokenizer, tmp_path):
    path = tiny_kit.model_dir("gemma2")
    dataset = text_dataset(8)
    torch.manual_seed(0)
    # both layers adapted with random, non-zero residuals: layer 1's inputs would move if layer 0's adapter acted
    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(path),
        AtlasConfig(r=4, num_regions=1, num_directions=2, layers_to_transform=[0, 1], init_weights=False),
    )
    model.train()
    trainable = sorted(n for n, p in model.named_parameters() if p.requires_grad)
    fit_atlas(model, dataset, tokenizer=tiny_tokenizer, progress=False)
    assert model.training and sorted(n for n, p in model.named_parameters() if p.requires_grad) == trainable
    rows = real_token_inputs(AutoModelForCausalLM.from_pretrained(path), batches_of(dataset, tiny_tokenizer, 4), 1)
    assert_global_pca(model.base_model.model.get_submodule(O_PROJ.format(1)), rows, 2)
    # the fitted atlas is what gets saved and loaded
    model.save_pretrained(tmp_path)
    loaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(path), tmp_path)
    for layer in (0, 1):
        fitted = model.base_model.model.get_submodule(O_PROJ.format(layer)).atlas_centers["default"]
        again = loaded.base_model.model.get_submodule(O_PROJ.format(layer)).atlas_centers["default"]
        assert torch.equal(fitted, again)


def test_a_dataloader_of_padded_batches_gives_the_dataset_s_atlas(tiny_kit, tiny_tokenizer):
    path = tiny_kit.model_dir("mistral")
    dataset = text_dataset(9)
    fitted = []
    for data in (dataset, batches_of(dataset, tiny_tokenizer, 4)):
        model = get_peft_model(AutoModelForCausalLM.from_pretrained(path), AtlasConfig(r=4, num_regions=1))
        fit_atlas(model, data, tokenizer=tiny_tokenizer, batch_size=2, progress=False)
        fitted.append(model.base_model.model.get_submodule(O_PROJ.format(1)))
    for name in ("atlas_centers", "atlas_in_spectrum", "atlas_in_basis", "atlas_calibration"):
        torch.testing.assert_close(
            getattr(fitted[0], name)["default"].abs(), getattr(fitted[1], name)["default"].abs()
        )


def test_several_regions_give_a_soft_routing_scale_and_the_adapter_still_starts_at_identity(tiny_kit, tiny_tokenizer):
    path = tiny_kit.model_dir("qwen2")
    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(path), AtlasConfig(r=4, num_regions=4, num_directions=3)
    )
    report = fit_atlas(model, text_dataset(16), tokenizer=tiny_tokenizer, progress=False)
    layer = model.base_model.model.get_submodule(O_PROJ.format(1))
    counts = report.region_tokens[next(iter(report.region_tokens))]
    assert sum(counts) == report.tokens and min(counts) > 0
    tau, s_d = layer.atlas_calibration["default"].tolist()
    assert tau > 0 and s_d > 0
    assert report.atlas_nbytes == layer.atlas_nbytes("default") > 0
    ids = torch.tensor([[3, 17, 29, 41]])
    with model.disable_adapter():
        reference = model(ids).logits
    assert torch.equal(model(ids).logits, reference)  # B = 0 still


def test_fit_on_a_plain_mlp_from_a_dataloader():
    torch.manual_seed(0)
    mlp = nn.Sequential()
    mlp.add_module("lin0", nn.Linear(6, 5))
    mlp.add_module("act", nn.ReLU())
    mlp.add_module("lin1", nn.Linear(5, 3))
    model = get_peft_model(mlp, AtlasConfig(target_modules=["lin0", "lin1"], r=2, num_regions=1, num_directions=2))

    data = [torch.randn(20, 6) for _ in range(3)]
    fit_atlas(model, [{"input": x} for x in data], progress=False, forward_fn=lambda m, batch: m(batch["input"]))
    torch.testing.assert_close(
        model.base_model.model.lin0.atlas_centers["default"][0], torch.cat(data).mean(0), atol=1e-5, rtol=0
    )


def test_fit_errors_name_the_problem(tiny_kit, tiny_tokenizer):
    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(tiny_kit.model_dir("llama")), AtlasConfig(num_regions=4)
    )
    with pytest.raises(ValueError, match="needs `tokenizer=`"):
        fit_atlas(model, text_dataset(2), progress=False)
    with pytest.raises(ValueError, match="no ATLAS layers for adapter 'nope'"):
        fit_atlas(model, text_dataset(2), tokenizer=tiny_tokenizer, adapter_name="nope", progress=False)
    with pytest.raises(ValueError, match="at least 4 rows"):
        fit_atlas(model, text_dataset(1), tokenizer=tiny_tokenizer, max_length=2, progress=False)


def test_regions_with_fewer_tokens_than_directions_are_named(tiny_kit, tiny_tokenizer):
    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(tiny_kit.model_dir("llama")), AtlasConfig(num_regions=4, num_directions=8)
    )
    with pytest.warns(
        UserWarning, match=r"fewer tokens than the 8 directions per region \(region_tokens=\["
    ) as caught:
        report = fit_atlas(model, text_dataset(1), tokenizer=tiny_tokenizer, max_length=6, progress=False)
    counts = next(iter(report.region_tokens.values()))
    assert sum(counts) == 6
    assert str(counts) in str(caught[0].message)
    # enough tokens per region: no warning
    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(tiny_kit.model_dir("llama")), AtlasConfig(num_regions=1, num_directions=2)
    )
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="atlas of")
        fit_atlas(model, text_dataset(4), tokenizer=tiny_tokenizer, progress=False)
