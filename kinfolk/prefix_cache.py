"""Measuring from the first changed layer: what decoder layer L receives on fixed batches, computed once.

When every trainable parameter and every adapter of a model lies in decoder layers L and above (ATLAS's default
placement: one layer's attention output at 0.47 of the depth), layers 0..L−1 compute the same thing at every
measurement. `PrefixCache.build` runs them once over a fixed list of batches and keeps the hidden states entering
layer L; inside `cache.active(model)`, a forward of the backbone on one of those batches skips layers 0..L−1 and
starts at layer L with the kept states. Everything else is the model's own forward: embeddings (computed and
discarded: cheap), the position embeddings and per-layer-type attention masks (computed once per forward, from the
batch, exactly as without the cache), layers L.., the final norm, and whatever head the caller runs after it
(logit scale, soft-capping, TRL's fused head). Nothing but the hidden states flows from one layer to the next in
transformers 5's decoders without a KV cache, so the result is the full forward's.

The model decides, not a flag: `first_changed_layer` reads which parameters require grad and which modules carry
a PEFT adapter; the cache is not built when any of them lies below layer 1 or outside the decoder layers (full
fine-tuning, LoRA on every layer, a trainable embedding), and `active` measures fully when that has changed since
it was built (or the layers' dtype has). Batches are found by a hash of their tokens, attention mask, position ids
and shape (so padding and row order count); any other forward (another batch, generation with a KV cache, input
embeddings) runs in full. `build` checks on its first batch that the injected forward equals the full one and keeps
nothing if it does not (an architecture whose layers pass more than hidden states).

Another model whose first layers are bit for bit this one's (a patched size and the teacher or student it starts
with) can start from the same states: `PrefixCache.capture` keeps what several layers receive in one pass,
`shared_prefix_layers` counts the layers two models share, and `injected` starts a forward there.

Memory: batch × length × hidden size in the model's dtype per batch, in host memory, or on disk under `directory`
when more than `memory_limit_bytes`; `close()` frees both. Each process of a distributed run caches the batches it
measures (its own shard).

>>> import torch
>>> from peft import LoraConfig, get_peft_model
>>> from kinfolk.testing import build_model
>>> model = get_peft_model(build_model("llama", "large"), LoraConfig(target_modules=["o_proj"], layers_to_transform=[2]))
>>> first_changed_layer(model).index
2
>>> batch = {"input_ids": torch.tensor([[5, 6, 7, 8, 9]]), "attention_mask": torch.ones(1, 5, dtype=torch.long)}
>>> cache = PrefixCache.build(model, [batch]).cache
>>> with torch.no_grad():
...     full = model(**batch).logits
...     with cache.active(model):
...         from_layer = model(**batch).logits
>>> cache.layer, bool(torch.allclose(full, from_layer, atol=1e-6))
(2, True)
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import shutil
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from peft.tuners.tuners_utils import BaseTunerLayer
from peft.utils.other import AuxiliaryTrainingWrapper
from safetensors import safe_open
from safetensors.torch import save as save_safetensors
from torch import nn

from kinfolk.atomic import atomic_file
from kinfolk.errors import UnsupportedArchitectureError
from kinfolk.layout import base_model, decoder_layers, layout_from_config, per_layer_config_fields

logger = logging.getLogger(__name__)

MEMORY_LIMIT_BYTES = 4 * 1024**3  # beyond this, and with a directory given, the states go to disk
# The injected forward must equal the full one on the build's first batch; this relative error still passes
# (kernels may round differently), a layer that passes more than hidden states misses it by orders of magnitude.
CHECK_TOLERANCE = 1e-3


@dataclass(frozen=True)
class ChangedLayer:
    """The lowest decoder layer a trainable parameter or an adapter lies in (None: no prefix to skip) and why."""

    index: int | None
    reason: str


def _is_adapter(module: nn.Module) -> bool:
    # PEFT's tuner layers, and its other wrappers (modules_to_save, trainable tokens), which are not tuner layers
    return isinstance(module, (BaseTunerLayer, AuxiliaryTrainingWrapper))


def first_changed_layer(model: nn.Module) -> ChangedLayer:
    """Where a model can differ from its frozen self, read from the model: the lowest decoder layer holding a
    parameter that requires grad or a PEFT adapter module. `index` is None when something outside the decoder
    layers (embeddings, final norm, head) is trainable or adapted, when nothing is, or the layout is unknown."""
    base = base_model(model)
    try:
        layers = decoder_layers(base)
    except (UnsupportedArchitectureError, AttributeError) as error:
        return ChangedLayer(None, f"unknown decoder layout ({error})")
    layer_of = {}
    for index, layer in enumerate(layers):
        layer_of.update({id(parameter): index for parameter in layer.parameters()})
        layer_of.update({id(module): index for module in layer.modules()})
    changed = [(name, id(parameter)) for name, parameter in model.named_parameters() if parameter.requires_grad]
    changed += [(name, id(module)) for name, module in model.named_modules() if _is_adapter(module)]
    outside = [name for name, key in changed if key not in layer_of]
    if outside:
        return ChangedLayer(None, f"{outside[0]} lies outside the decoder layers and can change")
    if not changed:
        return ChangedLayer(None, "nothing is trainable or adapted")
    lowest = min(layer_of[key] for _, key in changed)
    return ChangedLayer(lowest, f"every trainable parameter and adapter lies in layer {lowest} or above")


def shared_prefix_layers(model: nn.Module, source: nn.Module) -> int:
    """How many leading decoder layers of `model` compute what `source`'s do: with the same input embeddings and
    backbone buffers outside the layers (rotary tables, embedding scales), the count of layers from the first whose
    tensors and per-layer config entries (e.g. `layer_types`) equal `source`'s layer by layer; 0 when the
    embeddings or buffers differ. States `source` gives layer L (`PrefixCache.capture`) are then what `model`'s layer
    L receives, for L up to that count (a patched size and the teacher or student it starts with).

    >>> from kinfolk.testing import build_model, perturbed_copy
    >>> model = build_model("llama", "large")
    >>> changed = perturbed_copy(model, scale=0.1, seed=1)
    >>> changed.model.layers[:2].load_state_dict(model.model.layers[:2].state_dict())
    <All keys matched successfully>
    >>> changed.model.embed_tokens.load_state_dict(model.model.embed_tokens.state_dict())
    <All keys matched successfully>
    >>> shared_prefix_layers(changed, model), shared_prefix_layers(model, model)
    (2, 4)
    """
    ours, theirs = _backbone(model), _backbone(source)
    if not _same_tensors(ours.get_input_embeddings().state_dict(), theirs.get_input_embeddings().state_dict()):
        return 0
    inside_layers = {id(buffer) for layer in decoder_layers(model) for buffer in layer.buffers()}
    inside_layers |= {id(buffer) for layer in decoder_layers(source) for buffer in layer.buffers()}
    outside = lambda module: {n: b for n, b in module.named_buffers() if id(b) not in inside_layers}  # noqa: E731
    if not _same_tensors(outside(ours), outside(theirs)):
        return 0
    config, source_config = base_model(model).config.get_text_config(), base_model(source).config.get_text_config()
    per_layer = {name: getattr(config, name) for name in per_layer_config_fields(config)}
    source_per_layer = {name: getattr(source_config, name, None) for name in per_layer}
    shared = 0
    for index, (layer, source_layer) in enumerate(zip(decoder_layers(model), decoder_layers(source))):
        same_config = all(
            isinstance(source_per_layer[name], list) and index < len(source_per_layer[name])
            and values[index] == source_per_layer[name][index]
            for name, values in per_layer.items()
        )  # fmt: skip
        if not same_config or not _same_tensors(layer.state_dict(), source_layer.state_dict()):
            break
        shared += 1
    return shared


def _same_tensors(ours: dict[str, torch.Tensor], theirs: dict[str, torch.Tensor]) -> bool:
    return ours.keys() == theirs.keys() and all(
        ours[name].dtype == theirs[name].dtype and torch.equal(ours[name], theirs[name]) for name in ours
    )


def batch_key(input_ids: torch.Tensor, attention_mask: torch.Tensor | None, position_ids: torch.Tensor | None) -> str:
    """Hash of what the layers below L see of a batch: tokens, attention mask, position ids and their shapes."""
    digest = hashlib.sha256()
    for tensor in (input_ids, attention_mask, position_ids):
        if tensor is None:
            digest.update(b"none")
            continue
        digest.update(str(tuple(tensor.shape)).encode())
        digest.update(tensor.detach().to("cpu", torch.int64).contiguous().numpy().tobytes())
    return digest.hexdigest()[:32]


def _backbone(model: nn.Module) -> nn.Module:
    """The module whose forward runs the decoder layers (e.g. `LlamaModel`): the layer list's parent."""
    base = base_model(model)
    parent, _, _ = layout_from_config(base.config).layer_prefix.rpartition(".")
    return base.get_submodule(parent)


def _argument(name: str, position: int, args: tuple, kwargs: dict):
    return kwargs[name] if name in kwargs else (args[position] if len(args) > position else None)


class _Injection:
    """The hooks of one `active` context: the backbone's pre-hook looks the batch up, layers below L return their
    input unchanged while a batch is found, and layer L's pre-hook swaps in the kept states."""

    def __init__(self, cache: PrefixCache, layers: nn.ModuleList):
        self.cache = cache
        self.layers = layers
        self.pending: torch.Tensor | None = None

    def find_batch(self, _module, args, kwargs):
        self.pending = None
        input_ids = _argument("input_ids", 0, args, kwargs)
        has_kv_cache = any(kwargs.get(name) is not None for name in ("cache", "past_key_values"))
        if input_ids is None or has_kv_cache:
            return None
        key = batch_key(input_ids, _argument("attention_mask", 1, args, kwargs), kwargs.get("position_ids"))
        if key in self.cache:
            device = next(self.layers[self.cache.layer].parameters()).device
            self.pending = self.cache.states(key, device)
        return None

    def skip(self, original):
        def forward(*args, **kwargs):
            if self.pending is None:
                return original(*args, **kwargs)
            return _argument("hidden_states", 0, args, kwargs)

        return forward

    def inject(self, _module, args, kwargs):
        if self.pending is None:
            return None
        states, self.pending = self.pending, None
        incoming = _argument("hidden_states", 0, args, kwargs)
        if incoming.shape != states.shape:
            raise RuntimeError(f"kept states {tuple(states.shape)} do not fit layer input {tuple(incoming.shape)}")
        if "hidden_states" in kwargs:
            return args, {**kwargs, "hidden_states": states}
        return (states, *args[1:]), kwargs


@contextlib.contextmanager
def _replaced_forwards(layers: Iterable[nn.Module], make_forward) -> Iterator[None]:
    """Each layer's `forward` replaced by `make_forward(original)` for the context (an instance attribute, so the
    module's hooks, e.g. FSDP2's gathering, still run); any instance-level forward (accelerate's) is restored."""
    saved = [(layer, layer.__dict__.get("forward")) for layer in layers]
    try:
        for layer, _ in saved:
            layer.forward = make_forward(layer.forward)
        yield
    finally:
        for layer, own in saved:
            layer.__dict__.pop("forward", None)
            if own is not None:
                layer.forward = own


def _pass_through(_original):
    return lambda *args, **kwargs: _argument("hidden_states", 0, args, kwargs)


@dataclass(frozen=True)
class PrefixChoice:
    """What `PrefixCache.build` decided: the cache, or None and the reason it is not used."""

    cache: PrefixCache | None
    reason: str

    @property
    def description(self) -> str:
        return f"from layer {self.cache.layer}" if self.cache is not None else f"full forward: {self.reason}"


class PrefixCache:
    """The hidden states entering decoder layer `layer` for a fixed set of batches (see the module docstring)."""

    def __init__(self, layer: int, dtype: torch.dtype, directory: Path | None = None):
        self.layer = layer
        self.dtype = dtype
        self.directory = directory  # set when the states live on disk, one safetensors file per batch
        self.entries: dict[str, torch.Tensor | Path] = {}
        self.closed = False

    def __len__(self) -> int:
        return len(self.entries)

    def __contains__(self, key: str) -> bool:
        return key in self.entries

    def states(self, key: str, device: torch.device) -> torch.Tensor:
        entry = self.entries[key]
        if isinstance(entry, Path):
            with safe_open(str(entry), framework="pt", device=str(device)) as handle:
                return handle.get_tensor("hidden")
        return entry.to(device, non_blocking=True)

    @classmethod
    def build(
        cls,
        model: nn.Module,
        batches: Iterable[dict[str, torch.Tensor]],
        directory: str | Path | None = None,
        memory_limit_bytes: int = MEMORY_LIMIT_BYTES,
    ) -> PrefixChoice:
        """Keep what layer L receives on each of `batches` (dicts with `input_ids`, optional `attention_mask` and
        `position_ids`), L = `first_changed_layer(model)`; no cache when L is None or 0, or
        when the check on the first batch fails. States beyond `memory_limit_bytes` go to `directory` if given."""
        changed = first_changed_layer(model)
        if not changed.index:
            reason = "layer 0 can change" if changed.index == 0 else changed.reason
            return PrefixChoice(None, reason)
        batches = list(batches)
        hidden_size = base_model(model).config.get_text_config().hidden_size
        dtype = next(decoder_layers(model)[changed.index].parameters()).dtype
        size = sum(batch["input_ids"].numel() for batch in batches) * hidden_size * dtype.itemsize
        on_disk = directory is not None and size > memory_limit_bytes
        cache = cls(changed.index, dtype, Path(directory) if on_disk else None)
        if on_disk:
            shutil.rmtree(cache.directory, ignore_errors=True)
            cache.directory.mkdir(parents=True)
        was_training = model.training
        model.eval()  # what a measurement sees: no dropout (callbacks build at train start, in train mode)
        try:
            _fill({cache.layer: cache}, model, batches)
            same = not batches or cache.same_as_full(model, batches[0])
        finally:
            model.train(was_training)
        if not same:
            cache.close()
            return PrefixChoice(None, f"the forward from layer {cache.layer} differs from the full one")
        return PrefixChoice(cache, changed.reason)

    @classmethod
    def capture(
        cls, model: nn.Module, batches: Iterable[dict[str, torch.Tensor]], layers: Iterable[int]
    ) -> dict[int, PrefixCache]:
        """What each of decoder `layers` receives on each of `batches`, kept in host memory, from one forward of the
        model's layers up to the highest of them per batch; `model` must be in eval mode. No check is made: the
        caller injects a cache only into models whose layers below it compute what `model`'s do
        (`shared_prefix_layers`), and may confirm with `same_as_full`.

        >>> from kinfolk.testing import build_model
        >>> model = build_model("llama", "large").eval()
        >>> batch = {"input_ids": torch.tensor([[5, 6, 7, 8]])}
        >>> caches = PrefixCache.capture(model, [batch], [1, 3])
        >>> sorted(caches), caches[3].same_as_full(model, batch, tolerance=1e-6)
        ([1, 3], True)
        """
        layers = sorted(set(layers))
        if not layers or layers[0] < 1:
            raise ValueError(f"layers to capture must be 1 or above, got {layers}")
        dtype = next(decoder_layers(model)[layers[0]].parameters()).dtype
        caches = {layer: cls(layer, dtype) for layer in layers}
        _fill(caches, model, list(batches))
        return caches

    def _keep(self, key: str, states: torch.Tensor) -> None:
        if key in self.entries:  # a repeated batch (e.g. a weight-0 pad of a shard)
            return
        if self.directory is None:
            self.entries[key] = states.to("cpu")
            return
        path = self.directory / f"{key}.safetensors"
        with atomic_file(path, mode="wb", encoding=None) as handle:
            handle.write(save_safetensors({"hidden": states.contiguous().cpu()}))
        self.entries[key] = path

    def same_as_full(
        self, model: nn.Module, batch: dict[str, torch.Tensor], tolerance: float = CHECK_TOLERANCE
    ) -> bool:
        """Whether `model`'s backbone on `batch` (a kept one) gives the same last hidden states injected as in full,
        within `tolerance` relative to their norm."""
        backbone = _backbone(model)
        with torch.no_grad():
            full = backbone(**_inputs(batch, model), use_cache=False).last_hidden_state.float()
            with self.injected(model):
                injected = backbone(**_inputs(batch, model), use_cache=False).last_hidden_state.float()
        return bool((injected - full).norm() <= tolerance * full.norm())

    def usable(self, model: nn.Module) -> str | None:
        """None when the kept states still hold for `model`, else why not."""
        if self.closed:
            return "the kept states were freed (close())"
        changed = first_changed_layer(model)
        if changed.index is None or changed.index < self.layer:
            return f"the model can now change below layer {self.layer} ({changed.reason})"
        dtype = next(decoder_layers(model)[self.layer].parameters()).dtype
        if dtype != self.dtype:
            return f"layer {self.layer} is now {dtype}, the kept states {self.dtype}"
        return None

    @contextlib.contextmanager
    def active(self, model: nn.Module) -> Iterator[bool]:
        """Forwards of `model`'s backbone on kept batches start at layer L while inside; yields whether the cache
        is in use (False, with a warning, when `usable` says it no longer holds: every forward then runs fully)."""
        problem = self.usable(model)
        if problem is not None:
            logger.warning("measuring with a full forward: %s", problem)
            yield False
            return
        with self.injected(model):
            yield True

    @contextlib.contextmanager
    def injected(self, model: nn.Module) -> Iterator[None]:
        """Forwards of `model`'s backbone on kept batches start at layer L with the kept states while inside, whether
        or not `usable` says they hold for it (for a model that shares another's first L layers)."""
        layers = decoder_layers(model)
        injection = _Injection(self, layers)
        hooks = [
            _backbone(model).register_forward_pre_hook(injection.find_batch, with_kwargs=True),
            layers[self.layer].register_forward_pre_hook(injection.inject, with_kwargs=True),
        ]
        try:
            with _replaced_forwards(layers[: self.layer], injection.skip):
                yield
        finally:
            for hook in hooks:
                hook.remove()

    def close(self) -> None:
        """Free the kept states (memory and any files)."""
        self.entries.clear()
        self.closed = True
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)


def _fill(caches: dict[int, PrefixCache], model: nn.Module, batches: list[dict[str, torch.Tensor]]) -> None:
    """Keep in each cache what its layer receives on each batch: one backbone forward per batch, the layers above
    the highest cached one passed through."""
    layers = decoder_layers(model)
    captured: dict[int, torch.Tensor] = {}

    def capture(layer: int):
        def hook(_module, args, kwargs):
            captured[layer] = _argument("hidden_states", 0, args, kwargs).detach()

        return hook

    hooks = [layers[layer].register_forward_pre_hook(capture(layer), with_kwargs=True) for layer in caches]
    try:
        with torch.no_grad(), _replaced_forwards(layers[max(caches) :], _pass_through):
            for batch in batches:
                captured.clear()
                _backbone(model)(**_inputs(batch, model), use_cache=False)
                for layer, cache in caches.items():
                    cache._keep(_key(batch), captured[layer])
    finally:
        for hook in hooks:
            hook.remove()


def _inputs(batch: dict[str, torch.Tensor], model: nn.Module) -> dict[str, torch.Tensor]:
    """The batch's backbone inputs on the embeddings' device."""
    device = base_model(model).get_input_embeddings().weight.device
    names = ("input_ids", "attention_mask", "position_ids")
    return {name: batch[name].to(device) for name in names if batch.get(name) is not None}


def _key(batch: dict[str, torch.Tensor]) -> str:
    return batch_key(batch["input_ids"], batch.get("attention_mask"), batch.get("position_ids"))


class MeasuredFromLayer:
    """A measurement's `PrefixCache`, built on first use and freed by `close()`: what a measuring callback holds.

    `enabled=False` measures with full forwards. `directory` is where large states go (beside the run).

    >>> from kinfolk.testing import build_model
    >>> prefix = MeasuredFromLayer(enabled=True)
    >>> with prefix.active(build_model("llama"), []) as in_use:  # full fine-tuning: every layer can change
    ...     in_use, prefix.layer, prefix.description
    (False, None, 'full forward: model.embed_tokens.weight lies outside the decoder layers and can change')
    """

    def __init__(self, enabled: bool = True, directory: str | Path | None = None):
        self.enabled = enabled
        self.directory = directory
        self.choice: PrefixChoice | None = None

    @property
    def layer(self) -> int | None:
        """The layer measurements start at (None: full forwards)."""
        return None if self.choice is None or self.choice.cache is None else self.choice.cache.layer

    @property
    def description(self) -> str:
        if not self.enabled:
            return "full forward: measuring from the first changed layer is off"
        return "not built yet" if self.choice is None else self.choice.description

    @contextlib.contextmanager
    def active(self, model: nn.Module, batches: Iterable[dict[str, torch.Tensor]]) -> Iterator[bool]:
        """Inside, forwards of `model` on `batches` start at the first changed layer where that is exact (the
        cache is built from `batches` on the first call); yields whether it is in use."""
        if self.enabled and self.choice is None:
            self.choice = PrefixCache.build(model, batches, self.directory)
            logger.info("measuring %s", self.choice.description)
        if self.layer is None:
            yield False
            return
        with self.choice.cache.active(model) as in_use:
            yield in_use

    def close(self) -> None:
        """Free the kept states; the next `active` builds them again."""
        if self.choice is not None and self.choice.cache is not None:
            self.choice.cache.close()
        self.choice = None
