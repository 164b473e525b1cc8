"""`kinfolk.adapter_checks.width_mismatch`: which saved adapter tensors fit which base weights, from shapes alone
(written out by hand here: a weight is out × in, LoRA's A is r × in and B out × r)."""

import pytest

from kinfolk.adapter_checks import adapted_module, width_mismatch

O_PROJ = "model.layers.0.self_attn.o_proj"
BASE = {f"{O_PROJ}.weight": (32, 48), "model.layers.0.mlp.up_proj.weight": (64, 48)}  # o_proj: 48 in, 32 out


def lora(a_shape, b_shape, module=O_PROJ):
    return {f"base_model.model.{module}.lora_A.weight": a_shape, f"base_model.model.{module}.lora_B.weight": b_shape}


def test_names_are_split_into_module_and_kind():
    assert adapted_module(f"base_model.model.{O_PROJ}.lora_A.weight") == (O_PROJ, "lora_A")
    assert adapted_module(f"base_model.model.{O_PROJ}.atlas_in_basis") == (O_PROJ, "atlas_in_basis")
    assert adapted_module(f"base_model.model.{O_PROJ}.lora_magnitude_vector") is None


@pytest.mark.parametrize(
    ("adapter", "fan_in_fan_out", "problem"),
    [
        (lora((4, 48), (32, 4)), False, None),
        (lora((4, 32), (32, 4)), False, "lora_A.weight is (4, 32), for a module 32 wide in"),
        (lora((4, 48), (48, 4)), False, "lora_B.weight is (48, 4), for a module 48 wide out"),
        # a Conv1D-style base stores in × out: (32, 48) is then 32 in, 48 out
        (lora((4, 32), (48, 4)), True, None),
        (lora((4, 48), (32, 4)), True, "(in × out)"),
        ({f"base_model.model.{O_PROJ}.atlas_out_basis": (2, 2, 32)}, False, None),
        ({f"base_model.model.{O_PROJ}.atlas_centers": (2, 32)}, False, "atlas_centers is (2, 32)"),
        # the names line up (o_proj is found), so a layer the base lacks is refused
        ({**lora((4, 48), (32, 4)), **lora((4, 48), (32, 4), "model.layers.7.self_attn.o_proj")}, False,
         "model.layers.7.self_attn.o_proj, which the base has no weight for"),
        # no full name lines up (a checkpoint stored under other names): only the kind of module counts
        (lora((4, 48), (32, 4), "transformer.h.0.self_attn.o_proj"), False, None),
        (lora((4, 48), (32, 4), "transformer.h.0.attn.c_attn"), False, "which the base has no weight for"),
    ],
)  # fmt: skip
def test_an_adapter_tensor_must_span_its_modules_width(adapter, fan_in_fan_out, problem):
    found = width_mismatch(adapter, BASE, fan_in_fan_out)
    if problem is None:
        assert found is None
    else:
        assert problem in found
