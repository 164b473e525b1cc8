"""The ATLAS residual against a hand-written, token-by-token reference with explicit matrices, for every variant."""

import math

import pytest
import torch
from torch import nn

from kinfolk.plugins.atlas import AtlasConfig
from kinfolk.plugins.atlas.config import RESIDUALS
from kinfolk.plugins.atlas.layer import ATLAS_BUFFERS, NOT_MERGEABLE, AtlasLinear


def reference_delta(h, A, B, atlas, variant):
    """Δ(h) for one token, written from the equations with d×d filter matrices (float64)."""
    mu, tau, s_d = atlas["centers"], atlas["calibration"][0], atlas["calibration"][1]
    if variant == "plain":
        return B @ torch.tanh(A @ h)
    distances = torch.stack([((h - mu[k]) ** 2).sum() for k in range(mu.shape[0])])
    w = torch.exp(-distances / tau)
    w = w / w.sum()
    x = h - sum(w[k] * mu[k] for k in range(mu.shape[0]))

    def filter_matrix(basis, spectrum):
        eye = torch.eye(basis.shape[-1], dtype=h.dtype)
        total = torch.zeros_like(eye)
        for k in range(basis.shape[0]):
            variances, floor = spectrum[k, :-1], spectrum[k, -1]
            gamma = variances / (variances + floor)
            total += w[k] * basis[k].T @ torch.diag(gamma) @ basis[k]
        return eye - total

    n_in = filter_matrix(atlas["in_basis"], atlas["in_spectrum"])
    n_out = filter_matrix(atlas["out_basis"], atlas["out_spectrum"])
    rho = float(((x @ n_in @ x + 1e-12) / (x @ x + 1e-12)).clamp(0, 1))
    table = {
        "centered": lambda: B @ torch.tanh(A @ x),
        "distance_scaled": lambda: math.tanh(float(x @ x / s_d)) * (B @ torch.tanh(A @ x)),
        "pca_scaled": lambda: rho * (B @ torch.tanh(A @ x)),
        "input_filter": lambda: rho * (B @ torch.tanh(A @ (n_in @ x))),
        "output_filter": lambda: rho * (n_out @ (B @ torch.tanh(A @ x))),
        "atlas": lambda: rho * (n_out @ (B @ torch.tanh(A @ (n_in @ x)))),
    }
    if variant == "norm_matched":  # the plain direction at the full residual's length
        plain = B @ torch.tanh(A @ h)
        return plain * table["atlas"]().norm() / plain.norm()
    return table[variant]()


def random_layer(variant, d_in=12, d_out=7, regions=3, directions=4, seed=0, dtype=torch.float64):
    torch.manual_seed(seed)
    base = nn.Linear(d_in, d_out).to(dtype)
    config = AtlasConfig(r=5, residual=variant, num_regions=regions, num_directions=directions, init_weights=False)
    return AtlasLinear(base, "default", config)


@pytest.mark.parametrize("variant", RESIDUALS)
def test_every_variant_matches_the_hand_written_reference(variant):
    layer = random_layer(variant)
    # Tokens near the centres, so routing is genuinely soft and the filters and scales all act.
    h = layer.atlas_centers["default"].double()[torch.randint(3, (9,))] + 0.7 * torch.randn(9, 12, dtype=torch.float64)
    atlas = {name[6:]: getattr(layer, name)["default"].double() for name in ATLAS_BUFFERS}
    A, B = layer.atlas_A["default"].detach(), layer.atlas_B["default"].detach()
    expected = torch.stack([reference_delta(token, A, B, atlas, variant) for token in h])
    got = layer(h) - layer.base_layer(h)
    torch.testing.assert_close(got, expected, rtol=1e-9, atol=1e-11)
    assert expected.abs().max() > 1e-3  # the adapter is not trivially zero in this set-up


def test_norm_matched_moves_each_token_as_far_as_atlas_in_the_plain_direction():
    h = torch.randn(9, 12, dtype=torch.float64)
    control, full, plain = (random_layer(variant) for variant in ("norm_matched", "atlas", "plain"))
    delta = control(h) - control.base_layer(h)
    atlas_delta, plain_delta = full(h) - full.base_layer(h), plain(h) - plain.base_layer(h)
    torch.testing.assert_close(delta.norm(dim=-1), atlas_delta.norm(dim=-1), rtol=1e-9, atol=1e-12)
    cosine = torch.nn.functional.cosine_similarity(delta, plain_delta, dim=-1)
    torch.testing.assert_close(cosine, torch.ones(9, dtype=torch.float64), rtol=0, atol=1e-12)
    assert not torch.allclose(atlas_delta.norm(dim=-1), plain_delta.norm(dim=-1))  # the rescaling does something


def test_norm_matched_scale_is_a_step_size_without_gradient():
    control = random_layer("norm_matched")
    h = torch.randn(5, 12, dtype=torch.float64)
    A, B = control.atlas_A["default"], control.atlas_B["default"]
    (control(h) - control.base_layer(h)).pow(2).sum().backward()
    # by hand: Δ = s · B t with t = tanh(A h) and s held fixed, so ∂(Σ‖Δ‖²)/∂B = Σ_tokens 2 s² (B t) tᵀ
    with torch.no_grad():
        t = torch.tanh(h @ A.T)
        plain = t @ B.T
        atlas = {name[6:]: getattr(control, name)["default"].double() for name in ATLAS_BUFFERS}
        full = torch.stack([reference_delta(token, A, B, atlas, "atlas") for token in h])
        s = full.norm(dim=-1, keepdim=True) / plain.norm(dim=-1, keepdim=True)
        expected = 2 * ((s**2) * plain).T @ t
    torch.testing.assert_close(B.grad, expected, rtol=1e-9, atol=1e-12)


def test_norm_matched_starts_training_from_zero_b():
    base = nn.Linear(12, 7).double()
    layer = AtlasLinear(base, "default", AtlasConfig(r=4, residual="norm_matched", num_regions=3))
    h = torch.randn(6, 12, dtype=torch.float64)
    layer(h).sum().backward()
    # at B = 0 the ratio is 0/0: the scale is 1 there, so B gets the plain residual's gradient Σ_tokens tanh(A h)
    expected = torch.tanh(h @ layer.atlas_A["default"].detach().T).sum(0).expand(7, 4)
    torch.testing.assert_close(layer.atlas_B["default"].grad, expected)


def test_token_geometry_is_the_routed_distance_and_the_pca_scale():
    layer = random_layer("atlas")
    h = torch.randn(2, 3, 12, dtype=torch.float64)
    atlas = {name[6:]: getattr(layer, name)["default"].double() for name in ATLAS_BUFFERS}
    geometry = layer.token_geometry(h, "default")
    mu, tau, s_d = atlas["centers"], atlas["calibration"][0], atlas["calibration"][1]
    for index, token in enumerate(h.reshape(6, 12)):
        w = torch.softmax(-((token - mu) ** 2).sum(-1) / tau, dim=0)
        x = token - w @ mu
        assert geometry["distance"].reshape(6)[index] == pytest.approx(float(x @ x / s_d), rel=1e-9)
        # ρ by its definition, from the full ATLAS residual's reference and the pca_scaled one: Δ_pca = ρ B tanh(A x)
        unscaled = layer.atlas_B["default"].detach() @ torch.tanh(layer.atlas_A["default"].detach() @ x)
        rho = (
            reference_delta(
                token, layer.atlas_A["default"].detach(), layer.atlas_B["default"].detach(), atlas, "pca_scaled"
            )
            / unscaled
        )
        assert geometry["rho"].reshape(6)[index] == pytest.approx(float(rho[0]), rel=1e-9)
    assert geometry["distance"].shape == geometry["rho"].shape == (2, 3)


def test_variants_differ_from_each_other_on_a_random_atlas():
    h = torch.randn(6, 12, dtype=torch.float64)
    outputs = {variant: random_layer(variant)(h) for variant in RESIDUALS}
    for a in RESIDUALS:
        for b in RESIDUALS:
            if a < b:
                assert not torch.allclose(outputs[a], outputs[b]), (a, b)


def test_residual_keeps_leading_dimensions_and_works_in_float32():
    layer = random_layer("atlas", dtype=torch.float32)
    h = torch.randn(2, 5, 12)
    flat = layer(h.reshape(10, 12)).reshape(2, 5, 7)
    torch.testing.assert_close(layer(h), flat)


@pytest.mark.parametrize("variant", RESIDUALS)
def test_fresh_adapter_is_exactly_the_base_layer(variant):
    base = nn.Linear(12, 7)
    layer = AtlasLinear(base, "default", AtlasConfig(r=4, residual=variant))
    h = torch.randn(3, 4, 12)
    assert torch.equal(layer(h), base(h))


def test_degenerate_atlas_reduces_every_variant_but_distance_scaling_to_plain():
    torch.manual_seed(0)
    h = torch.randn(5, 12, dtype=torch.float64)
    outputs = {}
    for variant in RESIDUALS:
        torch.manual_seed(1)
        layer = AtlasLinear(nn.Linear(12, 7).double(), "default", AtlasConfig(r=3, residual=variant))
        with torch.no_grad():
            layer.atlas_B["default"].normal_()
        outputs[variant] = layer(h)
    for variant in RESIDUALS:
        if variant != "distance_scaled":
            torch.testing.assert_close(outputs[variant], outputs["plain"])


def test_merge_is_refused_with_the_reason():
    layer = random_layer("atlas")
    with pytest.raises(NotImplementedError, match="nonlinear"):
        layer.merge()
    assert "unload()" in NOT_MERGEABLE


def test_set_atlas_checks_names_and_shapes():
    layer = random_layer("atlas")
    with pytest.raises(ValueError, match=r"centers .* shape \(3, 12\)"):
        layer.set_atlas("default", centers=torch.zeros(4, 12))
    with pytest.raises(KeyError, match="not an atlas buffer"):
        layer.set_atlas("default", means=torch.zeros(3, 12))


def test_directions_are_capped_at_the_module_widths():
    layer = AtlasLinear(nn.Linear(10, 2), "default", AtlasConfig(r=2, num_regions=2, num_directions=8))
    assert tuple(layer.atlas_in_basis["default"].shape) == (2, 8, 10)
    assert tuple(layer.atlas_out_basis["default"].shape) == (2, 2, 2)


def test_non_linear_modules_are_refused():
    with pytest.raises(TypeError, match=r"nn\.Linear"):
        AtlasLinear(nn.Conv1d(3, 3, 1), "default", AtlasConfig())


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("residual", "gated", "not an ATLAS variant"),
        ("r", 0, "positive"),
        ("num_regions", 0, "positive"),
        ("routing_temperature", 0.0, "> 0"),
        ("atlas_dtype", "int8", "atlas_dtype"),
    ],
)
def test_config_rejects_bad_values(field, value, message):
    with pytest.raises(ValueError, match=message):
        AtlasConfig(**{field: value})
