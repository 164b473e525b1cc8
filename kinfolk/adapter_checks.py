"""Adapter checks that need no model weights, run before a model loads.

- `check_adapter_fits_base`: a saved LoRA or ATLAS adapter against the base model it is about to be loaded onto,
  from the safetensors headers alone. Each adapter tensor fixes the width of the module it adapts (LoRA's `lora_A`
  is r × in, `lora_B` out × r; ATLAS's `atlas_A`, `atlas_B`, centres and bases likewise), and the base's header
  gives that module's weight, out × in. An adapter trained on another model is refused naming the tensor, both
  shapes and the base the adapter records, instead of failing (or, for same-width models, loading silently) after
  the base's weights are read.
- `check_adapter_on_empty_model`: a PEFT config built on an empty copy of the model (its modules on the meta
  device: no weights read), so that PEFT's own refusals — no module matches `target_modules`, a layer the model
  does not have, a rank the module cannot take — come before the weights load, as one line naming the option.

>>> shapes = {"base_model.model.model.layers.0.self_attn.o_proj.lora_A.weight": (4, 48)}
>>> base = {"model.layers.0.self_attn.o_proj.weight": (32, 32)}
>>> print(width_mismatch(shapes, base, fan_in_fan_out=False))
base_model.model.model.layers.0.self_attn.o_proj.lora_A.weight is (4, 48), for a module 48 wide in; the base's model.layers.0.self_attn.o_proj.weight is (32, 32) (out × in)
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from kinfolk.errors import AdapterBaseMismatchError, InputError
from kinfolk.inputs import read_json

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
PEFT_PREFIX = "base_model.model."  # what PEFT puts before a module's name in a saved adapter
# adapter tensor -> (the base weight's side it spans, "in" or "out"; the tensor dimension holding it)
WIDTHS = {
    "lora_A": ("in", -1),
    "lora_B": ("out", 0),
    "atlas_A": ("in", -1),
    "atlas_B": ("out", 0),
    "atlas_centers": ("in", -1),
    "atlas_in_basis": ("in", -1),
    "atlas_out_basis": ("out", -1),
}


def adapted_module(name: str) -> tuple[str, str] | None:
    """(module, adapter tensor kind) of a saved adapter tensor name, or None for a tensor `WIDTHS` does not know
    (e.g. a `modules_to_save` copy, DoRA's magnitude)."""
    parts = name.removeprefix(PEFT_PREFIX).split(".")
    for index in range(len(parts) - 1, max(len(parts) - 3, 0) - 1, -1):
        if parts[index] in WIDTHS:
            return ".".join(parts[:index]), parts[index]
    return None


def width_mismatch(
    adapter_shapes: Mapping[str, Sequence[int]], base_shapes: Mapping[str, Sequence[int]], fan_in_fan_out: bool
) -> str | None:
    """The first adapter tensor whose width disagrees with its module's weight in the base (a weight is out × in,
    in × out under `fan_in_fan_out`), or that adapts a module the base lacks; None when every one fits.

    A module is looked up by its full name; when none of the adapter's modules is found that way (a checkpoint that
    stores its weights under other names), by its own name's last part, so only a base with no module of that kind
    at all is refused."""
    found = {name: adapted_module(name) for name in sorted(adapter_shapes)}
    found = {name: value for name, value in found.items() if value is not None}
    if not found:
        return None
    names_line_up = any(f"{module}.weight" in base_shapes for module, _ in found.values())
    for name, (module, kind) in found.items():
        weight = f"{module}.weight"
        if weight not in base_shapes:
            leaf = module.rsplit(".", 1)[-1]
            if names_line_up or not any(key.endswith(f".{leaf}.weight") for key in base_shapes):
                return f"{name} adapts {module}, which the base has no weight for"
            continue
        side, dimension = WIDTHS[kind]
        base_shape, shape = tuple(base_shapes[weight]), tuple(adapter_shapes[name])
        if len(base_shape) != 2 or not shape:
            continue
        out_width, in_width = base_shape[::-1] if fan_in_fan_out else base_shape
        if shape[dimension] != (in_width if side == "in" else out_width):
            layout = "in × out" if fan_in_fan_out else "out × in"
            return (
                f"{name} is {shape}, for a module {shape[dimension]} wide {side}; the base's {weight} is "
                f"{base_shape} ({layout})"
            )
    return None


def check_adapter_fits_base(adapter: str | Path, base: str | Path, role: str = "adapter") -> None:
    """Refuse a saved adapter directory whose tensors do not fit the base model directory `base` (headers only).

    Nothing is checked where either side is not a local directory of safetensors files (a Hub id, another weight
    format): loading reports what it finds there. `role` names the adapter as the user gave it ("the peft=
    adapter")."""
    from kinfolk.tensors import TensorReader, open_safetensors

    adapter, base = Path(adapter), Path(base)
    weights = adapter / ADAPTER_WEIGHTS
    if not weights.is_file() or not base.is_dir():
        return
    try:
        reader = TensorReader(base)
    except InputError:
        return  # no safetensors weights: the base's own checks name that
    config = read_json(adapter / ADAPTER_CONFIG, "adapter config") if (adapter / ADAPTER_CONFIG).is_file() else {}
    with open_safetensors(weights) as handle:
        shapes = {name: tuple(handle.get_slice(name).get_shape()) for name in sorted(handle.keys())}
    base_shapes = {name: shape for name, (shape, _) in reader.manifest().items()}
    problem = width_mismatch(shapes, base_shapes, bool(config.get("fan_in_fan_out")))
    if problem is not None:
        recorded = config.get("base_model_name_or_path")
        made_on = f" (its adapter_config.json names the base {recorded})" if recorded else ""
        raise AdapterBaseMismatchError(
            f"{role} {adapter} was made for another model than {base}{made_on}: {problem}", path=adapter
        )


def check_adapter_on_empty_model(
    peft_config: Any, model: str | Path, option: str, hint: str = "", trust_remote_code: bool = False
) -> None:
    """Build `peft_config`'s adapter on an empty copy of `model` (config only, modules on the meta device) and
    refuse what PEFT refuses there as one `InputError` line: `option: PEFT's message` and `hint`.

    A model whose empty copy cannot be built here (its config or code does not load) is left to the real load."""
    import torch
    from peft import get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        config = AutoConfig.from_pretrained(str(model), trust_remote_code=trust_remote_code)
        with torch.device("meta"):
            empty = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
    except (OSError, ValueError, KeyError, ImportError):
        return
    try:
        get_peft_model(empty, copy.deepcopy(peft_config))
    except InputError:
        raise  # kinfolk's own adapter types say what is wrong in their own words
    except ValueError as error:
        message = " ".join(str(error).split())
        raise InputError(f"{option}: {message}{f' ({hint})' if hint else ''}") from error
