"""What an ATLAS adapter was made on, recorded and checked: a fingerprint of each adapted module's base weight.

The atlas describes one model's activations at one module. An adapter loaded onto another model of the same width
(a base checkpoint's adapter on its instruct sibling, a teacher's layer-15 adapter on a distilled student whose
layer 15 is the teacher's layer 29) loads without a shape error and silently routes by the wrong geometry. So the
adapter's config records, per adapted module, a hash of the base weight when the adapter is created
(`AtlasConfig.base_fingerprints`, saved in adapter_config.json), and loading it compares: a mismatch is a warning,
or an `AdapterBaseMismatchError` with `base_mismatch="error"` (or `KINFOLK_ATLAS_BASE_MISMATCH=error`, for tools
such as `kinfolk eval` that load the adapter themselves).

The hash is of the weight rounded to bfloat16, so one checkpoint loaded in float32, bfloat16 or float16 gives one
fingerprint, while any change of the weights (another layer, another checkpoint, fine-tuning) gives another. Weights
that are not plain floating tensors here (quantised, on the meta device, sharded by ZeRO-3 or FSDP) are not
fingerprinted, and then nothing is checked.

>>> import torch
>>> weight = torch.arange(6.0).reshape(2, 3)
>>> weight_fingerprint(weight) == weight_fingerprint(weight.to(torch.bfloat16))
True
>>> weight_fingerprint(weight) == weight_fingerprint(weight + 1)
False
"""

from __future__ import annotations

import hashlib
import logging
import os

import torch

from kinfolk.errors import AdapterBaseMismatchError

logger = logging.getLogger(__name__)

MISMATCH_ENV = "KINFOLK_ATLAS_BASE_MISMATCH"
MISMATCH_POLICIES = ("warn", "error")


def weight_fingerprint(weight: torch.Tensor) -> str | None:
    """`<shape>:bf16-sha256:<hex>` of the weight's bfloat16 bytes; None for a weight that cannot be read here."""
    if (
        not weight.is_floating_point()
        or weight.device.type == "meta"
        or weight.numel() == 0
        or hasattr(weight, "full_tensor")  # a DTensor shard
    ):
        return None
    rounded = weight.detach().to(device="cpu", dtype=torch.bfloat16).contiguous()
    digest = hashlib.sha256(rounded.view(torch.int16).numpy().tobytes())
    return f"{'x'.join(map(str, rounded.shape))}:bf16-sha256:{digest.hexdigest()[:32]}"


def _shape(fingerprint: str) -> str:
    return fingerprint.split(":", 1)[0]


def check_and_record(config, module_key: str, weight: torch.Tensor, model_name: str | None) -> None:
    """Compare the base weight of `module_key` with the fingerprint `config` recorded for it (a loaded adapter), or
    record it (a new adapter). A mismatch warns, or raises under `config.base_mismatch == "error"`."""
    current = weight_fingerprint(weight)
    if current is None:
        return
    recorded = config.base_fingerprints if config.base_fingerprints is not None else {}
    config.base_fingerprints = recorded
    if module_key not in recorded:
        recorded[module_key] = current
        return
    if recorded[module_key] == current or _shape(recorded[module_key]) != _shape(current):
        return  # the same weights; or another width, which loading the adapter's tensors reports as such
    policy = os.environ.get(MISMATCH_ENV) or config.base_mismatch
    message = (
        f"{module_key}: this ATLAS adapter was made on another base module (recorded base model "
        f"{config.base_model_name_or_path!r}, this model {model_name!r}): its weights differ from the recorded ones, "
        f"so the atlas describes another model's activations. Load it onto the model it was made for; "
        f"base_mismatch='error' (or {MISMATCH_ENV}=error) refuses instead of warning"
    )
    if policy == "error":
        raise AdapterBaseMismatchError(message)
    logger.warning(message)
