"""`fit_atlas`: fill an ATLAS adapter's atlas from the frozen model's activations on retained data.

Like PEFT's data-dependent initialisations (EVA, CorDA), it runs after wrapping: `get_peft_model(base, AtlasConfig
(...))`, then `fit_atlas(model, retained, tokenizer=tok)`. Each pass runs the model with every adapter disabled
(the frozen model), with gradients off and in eval mode, only as far as the last adapted module; forward pre-hooks
on the adapted modules take their inputs, keep the real tokens (padding, and with `mask_prompt=True` prompt
tokens, are dropped) and stream them into one `StreamedKMeans` per module (sampling pass, mini-batch k-means
epochs, a Lloyd pass that also accumulates per-region covariances). Then, per module, the top-p eigenvectors of
each region's covariance (and of its image `W Σ Wᵀ` on the output side) become the directions, and the routing
temperature and distance scale are calibrated on a uniform sample of the tokens. Everything is written into the
adapter's persistent buffers, so `save_pretrained` stores it. The definitions are in `layer.py`.

Under several processes (`torchrun`, `accelerate launch`; any initialised `torch.distributed` group) it is called as
a trainer is, with the same data on every rank: each rank runs the model on its own share of the rows and the
k-means statistics are pooled across ranks (`ranks.py`), so the ranks fit one atlas together, bit-identical on
every rank (rank 0's tensors are broadcast at the end).

>>> from peft import get_peft_model
>>> from kinfolk.plugins.atlas import AtlasConfig, fit_atlas
>>> from kinfolk.testing import build_model, build_tokenizer, text_dataset
>>> tok = build_tokenizer()
>>> model = get_peft_model(build_model("qwen3", tokenizer=tok), AtlasConfig(r=4, num_regions=2))
>>> report = fit_atlas(model, text_dataset(8), tokenizer=tok, progress=False)
>>> report.modules, report.tokens > 0
(['base_model.model.model.layers.1.self_attn.o_proj'], True)
"""

from __future__ import annotations

import contextlib
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import torch
from datasets import Dataset
from torch import nn

from kinfolk.errors import EmptyDatasetError, InputError
from kinfolk.plugins.atlas.kmeans import StreamedKMeans, squared_distances
from kinfolk.plugins.atlas.layer import ZERO3_UNSUPPORTED, AtlasLayer, route
from kinfolk.plugins.atlas.ranks import Ranks
from kinfolk.sharding import zero3_partitioned


@dataclass
class AtlasFit:
    """What `fit_atlas` did: the adapted modules it fitted, tokens per module (over all ranks), passes, time, the atlas
    size, each region's token count per module, and the rows (of data or batches) each rank ran the model on."""

    modules: list[str]
    tokens: int
    passes: int
    seconds: float
    atlas_nbytes: int
    region_tokens: dict[str, list[int]] = field(default_factory=dict)
    rank_rows: list[int] = field(default_factory=list)


class _StopForward(Exception):
    """Raised by the last capture hook: the layers after the adapted modules need not run."""


def fit_atlas(
    model: nn.Module,
    data,
    tokenizer=None,
    *,
    adapter_name: str | None = None,
    batch_size: int = 8,
    max_length: int | None = 1024,
    mask_prompt: bool = False,
    minibatch_epochs: int = 1,
    lloyd_passes: int = 1,
    sample_size: int = 16384,
    seed: int = 0,
    forward_fn: Callable[[nn.Module, dict], object] | None = None,
    progress: bool = True,
    split_across_ranks: bool = True,
) -> AtlasFit:
    """Fit the atlas of `adapter_name` (default: the active adapter) on `data` and write it into the adapter.

    Args:
        model: a PEFT model (or a model with ATLAS layers injected) holding the adapter.
        data: a `datasets.Dataset` in any SFT format (`text`, `prompt`/`completion`, `messages`; tokenised with
            `kinfolk.tokens.sft_tokenize`, exactly as the SFT trainer would) or already holding `input_ids`; or a
            re-iterable of batches (e.g. a `DataLoader`) of dicts with `input_ids`, optional `attention_mask` and
            `labels` (-100 = not trained on), or any keyword inputs of the model.
        tokenizer: needed to tokenise a text dataset, and for its pad token.
        batch_size, max_length: batching of a dataset (rows are truncated to `max_length` tokens; None keeps all).
        mask_prompt: also drop tokens with label -100 (the prompt of prompt/completion data, non-assistant turns).
        minibatch_epochs, lloyd_passes, sample_size, seed: the k-means schedule (see `kmeans.StreamedKMeans`);
            the model runs `1 + minibatch_epochs + lloyd_passes` times over the data, up to the adapted layer.
        forward_fn: `forward_fn(model, batch)` runs the model on a batch; default `model(**batch)` without labels.
        progress: tqdm bars per pass.
        split_across_ranks: under several processes, each rank takes its share of `data` (a dataset's rows in
            contiguous blocks, every N-th batch of other data). False when each rank's `data` is already its own
            share (e.g. a data loader prepared by accelerate); the statistics are pooled either way.
    """
    adapter_name = adapter_name or _active_adapter(model)
    layers = {
        name: module
        for name, module in model.named_modules()
        if isinstance(module, AtlasLayer) and adapter_name in module.atlas_A
    }
    if not layers:
        raise ValueError(f"the model has no ATLAS layers for adapter {adapter_name!r}")
    if zero3_partitioned(model):  # loaded under ZeRO-3's zero.Init: a forward here would fail deep inside torch
        raise InputError(ZERO3_UNSUPPORTED)
    config = model.peft_config[adapter_name] if hasattr(model, "peft_config") else None
    num_regions = (
        config.num_regions if config is not None else next(iter(layers.values())).atlas_centers[adapter_name].shape[0]
    )
    temperature = config.routing_temperature if config is not None else 1.0
    ranks = Ranks.current()
    batches = batches_of(data, tokenizer, batch_size, max_length, ranks if split_across_ranks else Ranks())
    forward_fn = forward_fn or _default_forward
    device = _model_device(model)
    kmeans = {
        name: StreamedKMeans(
            num_regions,
            minibatch_epochs=minibatch_epochs,
            lloyd_passes=lloyd_passes,
            sample_size=sample_size,
            seed=seed,
            ranks=ranks,
        )
        for name in layers
    }
    start = time.perf_counter()
    passes = next(iter(kmeans.values())).passes
    with _frozen(model), _capture(layers) as captured:
        for index in range(passes):
            phase = next(iter(kmeans.values())).phase
            seen = rows = 0
            for batch in _progress(batches, progress, f"atlas fit pass {index + 1}/{passes} ({phase})"):
                seen += 1
                rows += _batch_rows(batch)
                batch = {key: value.to(device) if torch.is_tensor(value) else value for key, value in batch.items()}
                keep = _token_mask(batch, mask_prompt)
                captured.clear()
                with contextlib.suppress(_StopForward):
                    forward_fn(model, batch)
                for name, km in kmeans.items():
                    if name not in captured:
                        raise RuntimeError(f"the forward pass never reached the adapted module {name}")
                    km.observe(_select_tokens(captured[name], keep))
            if index == 0:
                rank_rows = ranks.each(rows)
                _check_tokens_seen(ranks.total(seen), ranks.total(next(iter(kmeans.values())).rows_seen), mask_prompt)
            for km in kmeans.values():
                km.end_pass()
    region_tokens = {}
    for name, layer in layers.items():
        km = kmeans[name]
        atlas = atlas_from_regions(layer, adapter_name, km, temperature)
        layer.set_atlas(adapter_name, **{key: ranks.broadcast(value) for key, value in atlas.items()})
        region_tokens[name] = [int(count) for count in km.counts.tolist()]
    if ranks.rank == 0:
        _warn_thin_regions(region_tokens, next(iter(layers.values())).atlas_in_basis[adapter_name].shape[1])
    return AtlasFit(
        modules=list(layers),
        tokens=next(iter(kmeans.values())).rows_seen,
        passes=passes,
        seconds=time.perf_counter() - start,
        atlas_nbytes=sum(layer.atlas_nbytes(adapter_name) for layer in layers.values()),
        region_tokens=region_tokens,
        rank_rows=rank_rows,
    )


def atlas_from_regions(
    layer: AtlasLayer, adapter_name: str, km: StreamedKMeans, routing_temperature: float
) -> dict[str, torch.Tensor]:
    """Atlas tensors of one layer from its finished k-means: centres, PCA directions and spectra, calibration."""
    centers = km.centers
    weight = layer.get_base_layer().weight.detach().to(centers.device, torch.float32)
    in_basis, in_spectrum, out_basis, out_spectrum = [], [], [], []
    p_in, p_out = layer.atlas_in_basis[adapter_name].shape[1], layer.atlas_out_basis[adapter_name].shape[1]
    for covariance in km.covariances:
        basis, spectrum = top_directions(covariance, p_in)
        in_basis.append(basis)
        in_spectrum.append(spectrum)
        basis, spectrum = top_directions(weight @ covariance @ weight.T, p_out)
        out_basis.append(basis)
        out_spectrum.append(spectrum)
    temperature = routing_temperature * _median_gap(km.sample, centers)
    x = km.sample - route(km.sample, centers, torch.tensor(temperature)) @ centers
    distance_scale = float(x.pow(2).sum(1).mean())
    return {
        "centers": centers,
        "in_basis": torch.stack(in_basis),
        "in_spectrum": torch.stack(in_spectrum),
        "out_basis": torch.stack(out_basis),
        "out_spectrum": torch.stack(out_spectrum),
        "calibration": torch.tensor([temperature, distance_scale if distance_scale > 0 else 1.0]),
    }


def top_directions(covariance: torch.Tensor, p: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The top-p eigenvectors (as rows) of a covariance and its spectrum: p variances, then the mean of the rest."""
    eigenvalues, eigenvectors = torch.linalg.eigh(covariance.double())
    eigenvalues = eigenvalues.clamp_min(0).flip(0)
    eigenvectors = eigenvectors.flip(1)
    d = covariance.shape[0]
    floor = eigenvalues[p:].mean() if d > p else eigenvalues.new_zeros(())
    spectrum = torch.cat([eigenvalues[:p], floor.reshape(1)])
    return eigenvectors[:, :p].T.float(), spectrum.float()


def _median_gap(sample: torch.Tensor, centers: torch.Tensor) -> float:
    """Median over sample rows of (squared distance to 2nd-nearest centre − to nearest); 1 with one centre."""
    if centers.shape[0] < 2:
        return 1.0
    two = squared_distances(sample, centers).topk(2, dim=1, largest=False).values
    gap = float((two[:, 1] - two[:, 0]).median())
    return gap if gap > 0 else 1.0


def _warn_thin_regions(region_tokens: dict[str, list[int]], directions: int) -> None:
    """Warn when a region has fewer tokens than PCA directions: its covariance has rank below the directions, so
    some of them (all, in an empty region) are arbitrary rather than fitted."""
    for name, counts in region_tokens.items():
        thin = [region for region, count in enumerate(counts) if count < directions]
        if thin:
            warnings.warn(
                f"atlas of {name}: regions {thin} have fewer tokens than the {directions} directions per region "
                f"(region_tokens={counts}); fit on more retained tokens or use fewer regions or directions",
                UserWarning,
                stacklevel=3,
            )


def _batch_rows(batch: dict) -> int:
    first = next((value for value in batch.values() if torch.is_tensor(value)), None)
    return int(first.shape[0]) if first is not None and first.ndim > 0 else 1


def _check_tokens_seen(batches: int, tokens: int, mask_prompt: bool) -> None:
    """Refuse retained data that gave the k-means nothing to fit, before it fails on empty statistics."""
    if batches == 0:
        raise EmptyDatasetError("the retained data gave no batches: the dataset or data loader is empty")
    if tokens == 0:
        masked = (
            " (mask_prompt=True dropped every prompt token and no completion token is left)" if mask_prompt else ""
        )
        raise EmptyDatasetError(f"the retained data's {batches} batches hold no real token{masked}")


def _active_adapter(model: nn.Module) -> str:
    active = getattr(model, "active_adapter", "default")
    return active if isinstance(active, str) else active[0]


def _model_device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


@contextlib.contextmanager
def _frozen(model: nn.Module) -> Iterator[None]:
    """Eval mode, no gradients, every adapter disabled; training mode and requires_grad flags restored after."""
    training = model.training
    requires_grad = {name: p.requires_grad for name, p in model.named_parameters()}
    disable = model.disable_adapter() if hasattr(model, "disable_adapter") else _disable_tuner_layers(model)
    model.eval()
    try:
        with disable, torch.no_grad():
            yield
    finally:
        model.train(training)
        for name, parameter in model.named_parameters():
            parameter.requires_grad_(requires_grad[name])


@contextlib.contextmanager
def _disable_tuner_layers(model: nn.Module) -> Iterator[None]:
    from peft.tuners.tuners_utils import BaseTunerLayer

    layers = [m for m in model.modules() if isinstance(m, BaseTunerLayer)]
    before = [layer._disable_adapters for layer in layers]
    for layer in layers:
        layer._disable_adapters = True
    try:
        yield
    finally:
        for layer, state in zip(layers, before):
            layer._disable_adapters = state


@contextlib.contextmanager
def _capture(layers: dict[str, nn.Module]) -> Iterator[dict[str, torch.Tensor]]:
    """Forward pre-hooks storing each layer's input; once all have fired, the forward is cut short."""
    captured: dict[str, torch.Tensor] = {}

    def hook_for(name):
        def hook(module, args):
            captured[name] = args[0].detach()
            if len(captured) == len(layers):
                raise _StopForward

        return hook

    handles = [layer.register_forward_pre_hook(hook_for(name)) for name, layer in layers.items()]
    try:
        yield captured
    finally:
        for handle in handles:
            handle.remove()


def _default_forward(model: nn.Module, batch: dict) -> object:
    inputs = {key: value for key, value in batch.items() if key != "labels"}
    if "input_ids" in inputs:
        inputs.setdefault("use_cache", False)
    return model(**inputs)


def _token_mask(batch: dict, mask_prompt: bool) -> torch.Tensor | None:
    mask = batch.get("attention_mask")
    mask = mask.bool() if mask is not None else None
    if mask_prompt:
        if "labels" not in batch:
            raise ValueError("mask_prompt=True needs `labels` in each batch (-100 marks prompt tokens)")
        completion = batch["labels"] != -100
        mask = completion if mask is None else mask & completion
    return mask


def _select_tokens(activations: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
    """(n, d) rows of the real tokens from a (B, T, d) or (B, d) activation."""
    if keep is not None and activations.ndim == keep.ndim + 1 and activations.shape[:-1] == keep.shape:
        return activations[keep]
    return activations.reshape(-1, activations.shape[-1])


def batches_of(data, tokenizer, batch_size: int, max_length: int | None, ranks: Ranks | None = None) -> Iterable[dict]:
    """Padded batches of a dataset (`kinfolk.batches.retained_batches`, with every token labelled when a tokenised
    dataset has no `labels`); any other data (a `DataLoader`, a list of batches) as it is. With `ranks`, this rank's
    share: a contiguous block of the dataset's rows (maybe none), or every `world`-th batch of other data."""
    ranks = ranks or Ranks()
    if not isinstance(data, Dataset):
        return _EveryNth(data, ranks) if ranks.many else data
    if ranks.many:
        data = data.select(ranks.share(range(len(data))))
        if len(data) == 0:
            return []
    # On use, not at import: this package is imported while PEFT registers ATLAS, which can happen inside
    # transformers' own import, before TRL (which kinfolk.batches needs) can be imported.
    from kinfolk.batches import retained_batches

    positions = "all" if "input_ids" in data.column_names and "labels" not in data.column_names else "response"
    return retained_batches(data, tokenizer, positions, max_length, batch_size, dataset_name="atlas-fitting")


class _EveryNth:
    """Batches `rank`, `rank + world`, ... of a re-iterable of batches (a rank's share of a data loader)."""

    def __init__(self, batches: Iterable[dict], ranks: Ranks):
        self.batches, self.ranks = batches, ranks

    def __iter__(self) -> Iterator[dict]:
        for index, batch in enumerate(self.batches):
            if index % self.ranks.world == self.ranks.rank:
                yield batch

    def __len__(self) -> int:
        return len(range(self.ranks.rank, len(self.batches), self.ranks.world))


def _progress(batches: Iterable, enabled: bool, description: str) -> Iterable:
    if not enabled:
        return batches
    from tqdm.auto import tqdm

    return tqdm(batches, desc=description, leave=False, total=len(batches) if hasattr(batches, "__len__") else None)
