r"""The ATLAS forward pass: a shared low-rank residual conditioned per token by an activation atlas.

A targeted `nn.Linear` computes `y = W h + b + Δ(h)`, where `h ∈ R^{d_in}` is the module's input for one token and
`Δ(h) ∈ R^{d_out}` the residual. `A ∈ R^{r×d_in}` and `B ∈ R^{d_out×r}` are the only trained tensors; the atlas
(fitted by `fit_atlas` on the frozen model's inputs of this module over retained data) is frozen and saved with the
adapter. The atlas holds, for regions k = 1..K:

- a centre `μ_k ∈ R^{d_in}` (k-means on retained inputs);
- input directions `U_k ∈ R^{p×d_in}` (orthonormal rows): the top-p eigenvectors of the region's input
  covariance `Σ_k`, with variances `λ_{k,1..p}` and floor `σ²_k`, the mean of its remaining eigenvalues;
- output directions `V_k ∈ R^{p×d_out}` with variances `λ'_k` and floor `σ'²_k`: the same construction on `W Σ_k Wᵀ`,
  which is exactly the covariance of the frozen module's outputs on region k, since the module is linear;
- two calibration scalars, the routing temperature `τ` and the distance scale `s_d` (below).

Definitions, per token (these are kinfolk's choices where the paper's tables leave the formula open):

- Soft routing: `w_k(h) = softmax_k(−‖h − μ_k‖² / τ)` (computed without the `‖h‖²` term, which cancels, and with
  the centres taken about their mean for float32 accuracy), with
  `τ = routing_temperature · median_t(‖h_t − μ_(2)‖² − ‖h_t − μ_(1)‖²)` over the fitting tokens, the median gap
  between each token's second-nearest and nearest centre: at temperature 1 a typical retained token weighs its own
  region e times more than the runner-up, whatever the activation scale. One region: w = 1 (τ is unused).
- Reference centre and centred state: `c(h) = Σ_k w_k(h) μ_k`, `x = h − c(h)`.
- Attenuation weights: `γ_{k,j} = λ_{k,j} / (λ_{k,j} + σ²_k) ∈ [0, 1)`: a direction far above its region's noise
  floor (one the retained geometry strongly represents) is almost removed, one at the floor is halved, and an
  unfitted atlas (λ = 0) removes nothing.
- Input filter: `N(h) = I − Σ_k w_k(h) U_kᵀ diag(γ_k) U_k`, symmetric with eigenvalues in (0, 1].
  Output filter: `N'(h) = I − Σ_k w_k(h) V_kᵀ diag(γ'_k) V_k`, the same with the output directions: the update
  `B·tanh(·)` lives in the output space, so that is where the output-side filter must act (for the paper's
  o_proj the two widths are equal and the paper writes one `N(h)`).
- PCA-derived scale: `ρ(h) = (xᵀ N(h) x + ε) / (xᵀ x + ε)` (ε = 1e-12), clamped to [0, 1]: the share of the
  centred state's energy that lies outside the attenuated retained directions. A token the retained geometry
  explains well gets a small update; an off-atlas token gets up to the full one.
- Distance scale: `s_d` = mean of `‖x‖²` over the fitting tokens, so `tanh(‖x‖²/s_d)` is about tanh(1) ≈ 0.76 for
  a typical retained token, near 0 at a centre and near 1 far from the atlas.

Residual variants (`AtlasConfig.residual`) and their row in the paper's Table 14:

| `residual`          | Table 14 row             | Δ(h)                                |
|---------------------|--------------------------|-------------------------------------|
| `"plain"`           | Plain                    | `B tanh(A h)`                       |
| `"centered"`        | Centered residual        | `B tanh(A x)`                       |
| `"distance_scaled"` | Distance-scaled residual | `tanh(‖x‖²/s_d) · B tanh(A x)`      |
| `"pca_scaled"`      | PCA-derived scaling      | `ρ(h) · B tanh(A x)`                |
| `"input_filter"`    | Input filter             | `ρ(h) · B tanh(A N(h) x)`           |
| `"output_filter"`   | Output filter            | `ρ(h) · N'(h) B tanh(A x)`          |
| `"atlas"`           | ATLAS (Table 2, full)    | `ρ(h) · N'(h) B tanh(A N(h) x)`     |
| `"norm_matched"`    | control (cf. Table 15)   | `s(h) · B tanh(A h)`                |

The full method composes both filters with the PCA scale: the shared residual sees the centred state with the
retained directions attenuated, and its update is attenuated the same way on the output side.

`norm_matched` is the control for step size: the plain residual rescaled token by token to the norm of the full
ATLAS residual of the same A and B, `s(h) = ‖Δ_atlas(h)‖ / ‖B tanh(A h)‖`, so it moves each token exactly as far as
ATLAS would but in the unfiltered direction (does filtering matter beyond how far each token moves?). `s(h)` acts
as a per-token step size: it carries no gradient (the plain residual's gradient, scaled by `s(h)`), and where the
plain residual is zero (B = 0 at initialisation, when the ratio is 0/0) `s = 1`, so training can start. The
paper's Table 15 rescales trained Plain checkpoints to paired ATLAS checkpoints after training; this control is
trained with the rescaling in place, so its fronts can be compared with every other method's.

The degenerate atlas of an unfitted adapter (centres at 0, λ = 0, floors, τ and s_d at 1) gives
`x = h`, `N = N' = I`, `ρ = 1`, so every variant except distance scaling reduces to the plain residual.

The residual is nonlinear in `h`, so it has no weight delta: `merge` refuses, `unload` drops the adapter.

>>> import torch
>>> from kinfolk.plugins.atlas import AtlasConfig
>>> from kinfolk.plugins.atlas.layer import AtlasLinear
>>> layer = AtlasLinear(torch.nn.Linear(8, 6), "default", AtlasConfig(r=2, num_regions=3, num_directions=2))
>>> tuple(layer.atlas_in_basis["default"].shape), tuple(layer.atlas_out_basis["default"].shape)
((3, 2, 8), (3, 2, 6))
>>> h = torch.randn(4, 8)
>>> torch.equal(layer(h), layer.base_layer(h))  # B starts at zero
True
"""

from __future__ import annotations

import math
from typing import Any

import torch
from peft.tuners._buffer_dict import BufferDict
from peft.tuners.tuners_utils import BaseTunerLayer
from torch import nn

from kinfolk.errors import AdapterConfigError, InputError
from kinfolk.plugins.atlas.config import AtlasConfig
from kinfolk.sharding import partitioned_by_zero3

_EPS = 1e-12

# The frozen atlas, per adapter; persistent, so saved in adapter_model.safetensors.
ATLAS_BUFFERS = (
    "atlas_centers",  # (K, d_in)
    "atlas_in_basis",  # (K, p_in, d_in)
    "atlas_in_spectrum",  # (K, p_in + 1): top variances, then the floor
    "atlas_out_basis",  # (K, p_out, d_out)
    "atlas_out_spectrum",  # (K, p_out + 1)
    "atlas_calibration",  # (2,): routing temperature τ, distance scale s_d
)

NOT_MERGEABLE = (
    "ATLAS adapters cannot be merged into the base weights: the residual ρ(h)·N'(h)·B·tanh(A·N(h)·(h − c(h))) is a "
    "nonlinear, token-dependent function of the input (tanh, soft routing, per-token filters), so no weight matrix "
    "reproduces it. Keep the adapter at inference, or use `unload()` to get the base model back without it."
)

# The one GPU check under ZeRO-3 (docs/distributed.md) trained an identity-initialised adapter for 30 steps with a flat
# loss: refused rather than a run that silently learns nothing. The cause is not isolated (a suspect: A and B are read
# from ParameterDicts, whose own forward, where ZeRO-3 gathers a module's weights, never runs; the GPU checks'
# diagnostic_zero3_atlas_unmeasured lifts this refusal to find out).
ZERO3_UNSUPPORTED = (
    "ATLAS adapters are not supported under DeepSpeed ZeRO-3 (a GPU check trained one with a flat loss); "
    "use DDP, FSDP2 or DeepSpeed ZeRO-2"
)


def refuse_if_zero3(parameter: torch.Tensor) -> None:
    """Raise `ZERO3_UNSUPPORTED` (one line) when DeepSpeed ZeRO-3 has partitioned the adapter's parameter."""
    if partitioned_by_zero3(parameter):
        raise InputError(ZERO3_UNSUPPORTED)


class AtlasLayer(BaseTunerLayer):
    adapter_layer_names = ("atlas_A", "atlas_B")
    other_param_names = (*ATLAS_BUFFERS, "r", "residual")

    def __init__(self, base_layer: nn.Module, **kwargs) -> None:
        self.base_layer = base_layer
        self.r: dict[str, int] = {}
        self.residual: dict[str, str] = {}
        self.atlas_A = nn.ParameterDict({})
        self.atlas_B = nn.ParameterDict({})
        for name in ATLAS_BUFFERS:
            setattr(self, name, BufferDict({}, persistent=True))
        self._disable_adapters = False
        self.merged_adapters = []
        self.kwargs = kwargs
        base = self.get_base_layer()
        if not isinstance(base, nn.Linear):
            raise TypeError(f"ATLAS adapts torch.nn.Linear modules only, got {type(base).__name__}")
        self.in_features, self.out_features = base.in_features, base.out_features

    def update_layer(self, adapter_name: str, config: AtlasConfig, **kwargs) -> None:
        r, regions = int(config.r), int(config.num_regions)
        if r > max(self.in_features, self.out_features):
            raise AdapterConfigError(
                f"r={r} is larger than the module's widths ({self.in_features} in, {self.out_features} out): the "
                f"residual B·tanh(A·h) is meant to be narrow; use r <= {max(self.in_features, self.out_features)}"
            )
        p_in = min(int(config.num_directions), self.in_features)
        p_out = min(int(config.num_directions), self.out_features)
        weight = self.get_base_layer().weight
        self.r[adapter_name] = r
        self.residual[adapter_name] = config.residual
        self.atlas_A[adapter_name] = nn.Parameter(torch.empty(r, self.in_features, device=weight.device))
        self.atlas_B[adapter_name] = nn.Parameter(torch.zeros(self.out_features, r, device=weight.device))
        degenerate = {
            "atlas_centers": torch.zeros(regions, self.in_features),
            "atlas_in_basis": torch.zeros(regions, p_in, self.in_features),
            "atlas_in_spectrum": torch.cat([torch.zeros(regions, p_in), torch.ones(regions, 1)], dim=1),
            "atlas_out_basis": torch.zeros(regions, p_out, self.out_features),
            "atlas_out_spectrum": torch.cat([torch.zeros(regions, p_out), torch.ones(regions, 1)], dim=1),
            "atlas_calibration": torch.ones(2),
        }
        for name, tensor in degenerate.items():
            getattr(self, name)[adapter_name] = tensor.to(device=weight.device, dtype=config.torch_atlas_dtype)
        self.reset_atlas_parameters(adapter_name, config.init_weights)
        self._move_adapter_to_device_of_base_layer(adapter_name)
        self.set_adapter(self.active_adapters, inference_mode=config.inference_mode)

    @torch.no_grad()
    def reset_atlas_parameters(self, adapter_name: str, init_weights: bool) -> None:
        """A as LoRA's (Kaiming-uniform) and B = 0; `init_weights=False` also draws B and a random, non-degenerate
        atlas so that tests see every term of every variant act."""
        nn.init.kaiming_uniform_(self.atlas_A[adapter_name], a=math.sqrt(5))
        if init_weights:
            nn.init.zeros_(self.atlas_B[adapter_name])
            return
        nn.init.normal_(self.atlas_B[adapter_name], std=1.0 / math.sqrt(self.r[adapter_name]))
        centers = self.atlas_centers[adapter_name]
        self.set_atlas(
            adapter_name,
            centers=torch.randn(centers.shape) * 0.5,
            in_basis=_random_orthonormal_rows(self.atlas_in_basis[adapter_name].shape),
            in_spectrum=torch.rand(self.atlas_in_spectrum[adapter_name].shape) * 2 + 0.1,
            out_basis=_random_orthonormal_rows(self.atlas_out_basis[adapter_name].shape),
            out_spectrum=torch.rand(self.atlas_out_spectrum[adapter_name].shape) * 2 + 0.1,
            calibration=torch.tensor([float(self.in_features), float(self.in_features)]),
        )

    @torch.no_grad()
    def set_atlas(self, adapter_name: str, **tensors: torch.Tensor) -> None:
        """Overwrite atlas buffers in place (shape-checked; device and storage dtype kept), e.g. from `fit_atlas`.

        Keyword names are the buffer names without the `atlas_` prefix: centers, in_basis, in_spectrum, out_basis,
        out_spectrum, calibration.
        """
        for key, value in tensors.items():
            name = f"atlas_{key}"
            if name not in ATLAS_BUFFERS:
                raise KeyError(f"{key!r} is not an atlas buffer; expected one of {[n[6:] for n in ATLAS_BUFFERS]}")
            target = getattr(self, name)[adapter_name]
            if tuple(value.shape) != tuple(target.shape):
                raise ValueError(
                    f"atlas {key} of adapter {adapter_name!r} has shape {tuple(target.shape)}, got {tuple(value.shape)}"
                )
            target.copy_(value)

    def atlas_nbytes(self, adapter_name: str) -> int:
        """Bytes the adapter's atlas occupies (as stored, and as saved)."""
        return sum(getattr(self, name)[adapter_name].nbytes for name in ATLAS_BUFFERS)

    def _move_adapter_to_device_of_base_layer(self, adapter_name: str, device: torch.device | None = None) -> None:
        # PEFT casts every floating adapter tensor to the base layer's dtype (and later upcasts to fp32): a bf16 base
        # would silently round an fp32 atlas. The atlas follows the base layer's device only.
        atlas = {
            name: getattr(self, name)[adapter_name] for name in ATLAS_BUFFERS if adapter_name in getattr(self, name)
        }
        super()._move_adapter_to_device_of_base_layer(adapter_name, device)
        for name, tensor in atlas.items():
            moved = getattr(self, name)[adapter_name]
            getattr(self, name)[adapter_name] = tensor.to(moved.device)

    def merge(self, safe_merge: bool = False, adapter_names: list[str] | None = None) -> None:
        raise NotImplementedError(NOT_MERGEABLE)

    def unmerge(self) -> None:
        raise NotImplementedError(NOT_MERGEABLE)

    def get_delta_weight(self, adapter_name: str) -> torch.Tensor:
        raise NotImplementedError(NOT_MERGEABLE)

    def residual_output(self, h: torch.Tensor, adapter_name: str) -> torch.Tensor:
        """Δ(h) of one adapter, in float32 (or wider), shaped like `h` with the last dim `out_features`."""
        A, B = self.atlas_A[adapter_name], self.atlas_B[adapter_name]
        dtype = torch.promote_types(A.dtype, torch.float32)
        flat = h.reshape(-1, h.shape[-1]).to(dtype)
        out = _residual(flat, A.to(dtype), B.to(dtype), self.residual[adapter_name], self._atlas(adapter_name, dtype))
        return out.reshape(*h.shape[:-1], B.shape[0])

    @torch.no_grad()
    def token_geometry(self, h: torch.Tensor, adapter_name: str) -> dict[str, torch.Tensor]:
        """Where tokens `h` (..., d_in) lie relative to the atlas, one value per token: `distance`, the squared
        distance to the routed centre ‖h − c(h)‖² in units of s_d (its mean over the fitting tokens, so about 1 for
        retained tokens and larger off the atlas), and `rho`, the PCA-derived scale ρ(h) ∈ [0, 1]."""
        atlas = self._atlas(adapter_name, torch.promote_types(h.dtype, torch.float32))
        flat = h.reshape(-1, h.shape[-1]).to(atlas["centers"].dtype)
        weights, x = _centred(flat, atlas)
        rho, _ = _pca_scale(x, weights, atlas)
        distance = x.pow(2).sum(-1) / atlas["calibration"][1]
        return {"distance": distance.reshape(h.shape[:-1]), "rho": rho.reshape(h.shape[:-1])}

    def _atlas(self, adapter_name: str, dtype: torch.dtype) -> dict[str, torch.Tensor]:
        return {name[6:]: getattr(self, name)[adapter_name].to(dtype) for name in ATLAS_BUFFERS}


class AtlasLinear(nn.Module, AtlasLayer):
    """An `nn.Linear` with ATLAS adapters."""

    def __init__(self, base_layer: nn.Module, adapter_name: str, config: AtlasConfig, **kwargs) -> None:
        super().__init__()
        AtlasLayer.__init__(self, base_layer, **kwargs)
        self._active_adapter = adapter_name
        self.update_layer(adapter_name, config)

    def forward(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        result = self.base_layer(x, *args, **kwargs)
        if self.disable_adapters:
            return result
        for adapter_name in self.active_adapters:
            if adapter_name in self.atlas_A:
                refuse_if_zero3(self.atlas_A[adapter_name])
                result = result + self.residual_output(x, adapter_name).to(result.dtype)
        return result

    def __repr__(self) -> str:
        return "atlas." + super().__repr__()


def _residual(h: torch.Tensor, A: torch.Tensor, B: torch.Tensor, variant: str, atlas: dict) -> torch.Tensor:
    """Δ for flat tokens `h` (n, d_in); see the module docstring for the equations."""
    if variant == "plain":
        return torch.tanh(h @ A.T) @ B.T
    if variant == "norm_matched":
        plain = torch.tanh(h @ A.T) @ B.T
        with torch.no_grad():
            plain_norm = plain.norm(dim=-1, keepdim=True)
            full_norm = _residual(h, A, B, "atlas", atlas).norm(dim=-1, keepdim=True)
            scale = torch.where(plain_norm > 0, full_norm / plain_norm.clamp_min(_EPS), torch.ones_like(plain_norm))
        return scale * plain
    weights, x = _centred(h, atlas)
    if variant == "centered":
        return torch.tanh(x @ A.T) @ B.T
    if variant == "distance_scaled":
        scale = torch.tanh(x.pow(2).sum(-1, keepdim=True) / atlas["calibration"][1])
        return scale * (torch.tanh(x @ A.T) @ B.T)
    rho, weighted = _pca_scale(x, weights, atlas)
    if variant in ("input_filter", "atlas"):
        x = x - weighted.flatten(1) @ atlas["in_basis"].flatten(0, 1)
    update = torch.tanh(x @ A.T) @ B.T
    if variant in ("output_filter", "atlas"):
        update = filter_directions(update, weights, atlas["out_basis"], attenuation(atlas["out_spectrum"]))
    return rho * update


def _centred(h: torch.Tensor, atlas: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """Routing weights w(h) (n, K) and the centred state x = h − c(h)."""
    weights = route(h, atlas["centers"], atlas["calibration"][0])
    return weights, h - weights @ atlas["centers"]


def _pca_scale(x: torch.Tensor, weights: torch.Tensor, atlas: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """ρ(h) (n, 1) and the weighted input coordinates w_k γ_kj (u_kjᵀx) (n, K, p) the input filter removes."""
    coords = coordinates(x, atlas["in_basis"])
    weighted = weights.unsqueeze(-1) * attenuation(atlas["in_spectrum"]) * coords
    energy = x.pow(2).sum(-1, keepdim=True)
    rho = (1 - (weighted * coords).sum((-2, -1)).unsqueeze(-1) / (energy + _EPS)).clamp(0.0, 1.0)
    return rho, weighted


def route(h: torch.Tensor, centers: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
    """Soft routing weights (n, K): softmax of −‖h − μ_k‖²/τ.

    With m the centres' mean and s_k = μ_k − m, −‖h − μ_k‖² = 2hᵀs_k − (2m + s_k)ᵀs_k + a term constant in k, which
    cancels in the softmax; taking the centres about m keeps float32 logits accurate far from the origin.
    """
    origin = centers.mean(0)
    shifted = centers - origin
    logits = torch.addmm(((2 * origin + shifted) * shifted).sum(-1), h, shifted.T, beta=-1, alpha=2) / temperature
    return torch.softmax(logits, dim=-1)


def attenuation(spectrum: torch.Tensor) -> torch.Tensor:
    """γ = λ / (λ + σ²) per region and direction, from a (K, p + 1) spectrum of top variances and the floor σ²."""
    variances, floor = spectrum[:, :-1], spectrum[:, -1:]
    return variances / (variances + floor).clamp_min(torch.finfo(spectrum.dtype).tiny)


def coordinates(v: torch.Tensor, basis: torch.Tensor) -> torch.Tensor:
    """(n, K, p) coordinates of rows `v` along each region's directions `basis` (K, p, d): one matrix product."""
    return (v @ basis.flatten(0, 1).T).unflatten(-1, basis.shape[:2])


def filter_directions(
    v: torch.Tensor, weights: torch.Tensor, basis: torch.Tensor, gamma: torch.Tensor
) -> torch.Tensor:
    """`(I − Σ_k w_k Bᵀ_k diag(γ_k) B_k) v` for each row of `v`."""
    weighted = weights.unsqueeze(-1) * gamma * coordinates(v, basis)
    return v - weighted.flatten(1) @ basis.flatten(0, 1)


def _random_orthonormal_rows(shape: torch.Size) -> torch.Tensor:
    regions, rows, width = shape
    q, _ = torch.linalg.qr(torch.randn(regions, width, rows))
    return q.transpose(1, 2).contiguous()
