"""A saved ATLAS adapter checked against its own `adapter_config.json` before PEFT loads it.

The tensor shapes record the rank `r`, the number of regions K and the directions p that the adapter was made
with; an `adapter_config.json` edited after saving (or copied from another adapter) disagrees with them, and PEFT
would report it as a size mismatch of some tensor. `config_mismatch` names the field and both values instead;
`check_saved_adapter` also names a truncated `adapter_model.safetensors`. `AtlasConfig.from_pretrained` runs it,
so `PeftModel.from_pretrained` and `AutoPeftModelForCausalLM` refuse such an adapter with a one-line error.

>>> shapes = {"m.atlas_A": (8, 64), "m.atlas_B": (64, 8), "m.atlas_centers": (16, 64), "m.atlas_in_basis": (16, 8, 64)}
>>> config_mismatch(shapes, r=4, num_regions=16, num_directions=8)
"adapter_config.json has r=4 but the saved tensors have r=8 (m.atlas_A: (8, 64)); was 'r' edited after saving?"
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from kinfolk.errors import AdapterConfigMismatchError
from kinfolk.tensors import open_safetensors

ADAPTER_WEIGHTS = "adapter_model.safetensors"

# (field, tensor suffix, the dimension of that tensor holding the field's value)
_FIELD_DIMENSIONS = (
    ("r", "atlas_A", 0),
    ("r", "atlas_B", 1),
    ("num_regions", "atlas_centers", 0),
    ("num_regions", "atlas_in_basis", 0),
    ("num_regions", "atlas_out_basis", 0),
)


def _stored_field(name: str) -> str | None:
    """The ATLAS tensor a state-dict key holds, whatever the prefix and adapter-name suffix."""
    parts = name.split(".")
    for part in reversed(parts[-2:]):
        if part.startswith("atlas_"):
            return part
    return None


def config_mismatch(shapes: Mapping[str, Sequence[int]], r: int, num_regions: int, num_directions: int) -> str | None:
    """The first field of the config that the tensor shapes contradict, as a message; None if all agree."""
    expected = {"r": int(r), "num_regions": int(num_regions)}
    for name, shape in sorted(shapes.items()):
        stored = _stored_field(name)
        for field, suffix, dimension in _FIELD_DIMENSIONS:
            if stored == suffix and len(shape) > dimension and int(shape[dimension]) != expected[field]:
                return (
                    f"adapter_config.json has {field}={expected[field]} but the saved tensors have "
                    f"{field}={int(shape[dimension])} ({name}: {tuple(int(size) for size in shape)}); was "
                    f"{field!r} edited after saving?"
                )
        if stored in ("atlas_in_basis", "atlas_out_basis") and len(shape) == 3:
            directions = min(int(num_directions), int(shape[2]))  # p is capped at the module's width
            if int(shape[1]) != directions:
                return (
                    f"adapter_config.json has num_directions={num_directions} (so {directions} directions here) but "
                    f"the saved tensors have {int(shape[1])} ({name}: {tuple(int(size) for size in shape)}); was "
                    "'num_directions' edited after saving?"
                )
    return None


def check_saved_adapter(directory: str | Path, r: int, num_regions: int, num_directions: int) -> None:
    """Refuse a saved adapter whose weights are unreadable or disagree with its config (reads the header only)."""
    path = Path(directory) / ADAPTER_WEIGHTS
    if not path.is_file():
        return  # saved in another format, or not saved locally: PEFT reports what it finds
    with open_safetensors(path) as handle:
        shapes = {name: handle.get_slice(name).get_shape() for name in sorted(handle.keys())}
    problem = config_mismatch(shapes, r, num_regions, num_directions)
    if problem is not None:
        raise AdapterConfigMismatchError(f"{Path(directory) / 'adapter_config.json'}: {problem}", path=directory)
