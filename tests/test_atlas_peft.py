"""ATLAS as a PEFT tuner: the behaviour PEFT's common tests expect of any tuner, on plain MLPs (lin0/lin1, as in
PEFT's test_custom_models.py) and on the tiny Llama, Qwen2, Qwen3, Gemma2 and Mistral models."""

import json
import warnings

import pytest
import torch
from peft import AutoPeftModelForCausalLM, PeftModel, get_peft_model
from safetensors import safe_open
from torch import nn
from transformers import AutoModelForCausalLM

import kinfolk
from kinfolk.commands.env import registered_peft_plugins
from kinfolk.peft_types import register_tuner
from kinfolk.plugins.atlas import AtlasConfig, AtlasModel
from kinfolk.plugins.atlas.layer import ATLAS_BUFFERS, AtlasLinear

ARCHS = ("llama", "qwen2", "qwen3", "gemma2", "mistral")


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin0 = nn.Linear(10, 20)
        self.relu = nn.ReLU()
        self.lin1 = nn.Linear(20, 2)

    def forward(self, X):
        return self.lin1(self.relu(self.lin0(X)))


def mlp_config(**overrides):
    fields = dict(target_modules=["lin0", "lin1"], r=4, num_regions=3, num_directions=3, init_weights=False)
    return AtlasConfig(**(fields | overrides))


def mlp_pair(config, seed=0):
    """A base MLP and a PEFT model wrapping a copy of it (same weights)."""
    torch.manual_seed(seed)
    base = MLP()
    copy = MLP()
    copy.load_state_dict(base.state_dict())
    return base, get_peft_model(copy, config)


def trainable_names(model):
    return sorted(name for name, p in model.named_parameters() if p.requires_grad)


X = torch.randn(16, 10, generator=torch.Generator().manual_seed(1))


def test_registered_on_import_kinfolk_and_idempotent():
    assert "ATLAS" in registered_peft_plugins()
    # registering again, as a re-import would, is a no-op
    register_tuner("atlas", AtlasConfig, AtlasModel, prefix="atlas_")
    import importlib

    importlib.reload(kinfolk)
    with pytest.raises(KeyError, match="already registered"):
        register_tuner("atlas", MLP, AtlasModel)


def test_fresh_adapter_is_the_identity_and_random_one_is_not():
    base, model = mlp_pair(mlp_config(init_weights=True))
    assert torch.equal(model(X), base(X))
    base, model = mlp_pair(mlp_config())
    assert not torch.allclose(model(X), base(X))


def test_only_a_and_b_train_and_only_they_change():
    _, model = mlp_pair(mlp_config())
    assert trainable_names(model) == [
        f"base_model.model.{layer}.atlas_{ab}.default" for layer in ("lin0", "lin1") for ab in "AB"
    ]
    before = {k: v.clone() for k, v in model.state_dict().items()}
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    for _ in range(3):
        optimizer.zero_grad()
        model(X).pow(2).sum().backward()
        optimizer.step()
    changed = sorted(k for k, v in model.state_dict().items() if not torch.equal(v, before[k]))
    assert changed == trainable_names(model)


def test_disable_adapter_gives_the_base_output_exactly():
    base, model = mlp_pair(mlp_config())
    with model.disable_adapter():
        assert torch.equal(model(X), base(X))
    assert not torch.allclose(model(X), base(X))


def test_save_load_round_trip_is_bit_exact(tmp_path):
    base, model = mlp_pair(mlp_config())
    model.save_pretrained(tmp_path)
    with safe_open(tmp_path / "adapter_model.safetensors", "pt") as f:
        keys = set(f.keys())
    assert {f"base_model.model.lin0.{name}" for name in ATLAS_BUFFERS} <= keys
    assert json.loads((tmp_path / "adapter_config.json").read_text())["peft_type"] == "ATLAS"
    fresh = MLP()
    fresh.load_state_dict(base.state_dict())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded = PeftModel.from_pretrained(fresh, tmp_path)
    assert not [w for w in caught if "missing adapter keys" in str(w.message)]
    assert torch.equal(loaded(X), model(X))
    for key, value in model.state_dict().items():
        assert torch.equal(value, loaded.state_dict()[key]), key


def test_several_adapters_set_adapter_delete_and_unload():
    base, model = mlp_pair(mlp_config())
    first = model(X)
    torch.manual_seed(5)
    model.add_adapter("other", mlp_config(residual="centered"))
    assert torch.equal(model(X), first)  # adding does not activate
    model.set_adapter("other")
    second = model(X)
    assert not torch.allclose(second, first)
    assert all(".other" in name for name in trainable_names(model))
    model.set_adapter("default")
    assert torch.equal(model(X), first)
    model.delete_adapter("default")
    assert model.active_adapters == ["other"]
    assert torch.equal(model(X), second)
    assert not any(".default" in key for key in model.state_dict())
    unloaded = model.unload()
    assert type(unloaded.lin0) is nn.Linear and type(unloaded.lin1) is nn.Linear
    assert torch.equal(unloaded(X), base(X))


def test_merge_and_merge_and_unload_are_refused():
    _, model = mlp_pair(mlp_config())
    with pytest.raises(NotImplementedError, match="nonlinear"):
        model.merge_and_unload()
    with pytest.raises(NotImplementedError, match="nonlinear"):
        model.merge_adapter()


def test_default_placement_needs_a_known_layout():
    with pytest.raises(ValueError, match="pass target_modules"):
        get_peft_model(MLP(), AtlasConfig())


def test_degenerate_adapter_trains_without_fitting():
    _, model = mlp_pair(mlp_config(init_weights=True))
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    target = torch.randn(16, 2)
    losses = []
    for _ in range(20):
        optimizer.zero_grad()
        loss = (model(X) - target).pow(2).mean()
        loss.backward()
        optimizer.step()
        losses.append(float(loss))
    assert losses[-1] < losses[0]


@pytest.fixture(scope="module", params=ARCHS)
def arch_dir(request, tiny_kit):
    return tiny_kit.model_dir(request.param)


def test_causal_lms_default_placement_identity_disable_and_round_trip(arch_dir, tmp_path):
    path = arch_dir
    ids = torch.tensor([[3, 17, 29, 41, 5, 8, 13]])
    base = AutoModelForCausalLM.from_pretrained(path)
    reference = base(ids).logits
    fresh = get_peft_model(AutoModelForCausalLM.from_pretrained(path), AtlasConfig(r=4))
    # 2 decoder layers: 47% depth is layer 1; the attention output projection is adapted
    assert fresh.base_model.targeted_module_names == ["model.layers.1.self_attn.o_proj"]
    assert torch.equal(fresh(ids).logits, reference)

    torch.manual_seed(0)
    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(path), AtlasConfig(r=4, num_regions=3, init_weights=False)
    )
    adapted = model(ids).logits
    assert not torch.allclose(adapted, reference)
    with model.disable_adapter():
        assert torch.equal(model(ids).logits, reference)
    model.save_pretrained(tmp_path)
    loaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(path), tmp_path)
    assert torch.equal(loaded(ids).logits, adapted)
    auto = AutoPeftModelForCausalLM.from_pretrained(tmp_path)
    assert torch.equal(auto(ids).logits, adapted)
    # generation with a KV cache goes through the same residual, one token at a time
    out = loaded.generate(input_ids=ids, max_new_tokens=3, do_sample=False)
    assert out.shape == (1, 10)


@pytest.mark.parametrize("use_reentrant", [True, False])
def test_gradient_checkpointing_gives_the_same_gradients(tiny_kit, use_reentrant):
    path = tiny_kit.model_dir("qwen3")
    ids = torch.tensor([[3, 17, 29, 41, 5, 8, 13, 2]])
    torch.manual_seed(0)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(path), AtlasConfig(r=4, init_weights=False))
    model.train()
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}

    def grads():
        for p in params.values():
            p.grad = None
        model(ids, labels=ids).loss.backward()
        return {n: p.grad.clone() for n, p in params.items()}

    plain = grads()
    model.gradient_checkpointing_enable({"use_reentrant": use_reentrant})
    model.enable_input_require_grads()
    checkpointed = grads()
    assert model.base_model.model.model.gradient_checkpointing
    for name in plain:
        assert plain[name].abs().sum() > 0
        torch.testing.assert_close(checkpointed[name], plain[name])


@pytest.mark.parametrize("atlas_dtype", ["float32", "bfloat16"])
def test_bf16_base_keeps_the_atlas_at_its_own_precision(tiny_kit, tmp_path, atlas_dtype):
    path = tiny_kit.model_dir("llama")
    config = dict(r=4, num_regions=3, num_directions=4, init_weights=False, atlas_dtype=atlas_dtype)
    torch.manual_seed(0)
    fp32 = get_peft_model(AutoModelForCausalLM.from_pretrained(path), AtlasConfig(**config))
    torch.manual_seed(0)
    bf16 = get_peft_model(AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16), AtlasConfig(**config))
    layer32 = fp32.base_model.model.model.layers[1].self_attn.o_proj
    layer16 = bf16.base_model.model.model.layers[1].self_attn.o_proj
    assert isinstance(layer16, AtlasLinear) and layer16.base_layer.weight.dtype == torch.bfloat16
    expected = getattr(torch, atlas_dtype)
    for name in ATLAS_BUFFERS:
        kept = getattr(layer16, name)["default"]
        assert kept.dtype == expected, name
        # the same values as on an fp32 base: nothing was rounded through the base's dtype
        assert torch.equal(kept, getattr(layer32, name)["default"].to(expected)), name
    # A and B follow PEFT's usual autocast to fp32
    assert layer16.atlas_A["default"].dtype == torch.float32
    size = sum(getattr(layer16, name)["default"].numel() for name in ATLAS_BUFFERS) * expected.itemsize
    assert bf16.base_model.atlas_nbytes() == size
    bf16.save_pretrained(tmp_path)
    with safe_open(tmp_path / "adapter_model.safetensors", "pt") as f:
        saved = f.get_tensor("base_model.model.model.layers.1.self_attn.o_proj.atlas_in_basis")
    assert saved.dtype == expected
    loaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16), tmp_path)
    reloaded = loaded.base_model.model.model.layers[1].self_attn.o_proj.atlas_in_basis["default"]
    assert reloaded.dtype == expected and torch.equal(reloaded, layer16.atlas_in_basis["default"])
    ids = torch.tensor([[3, 17, 29, 41]])
    assert torch.equal(loaded(ids).logits, bf16(ids).logits)


def test_loading_onto_a_base_of_another_width_fails_clearly(tiny_kit, tmp_path):
    small = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_kit.model_dir("qwen3")), AtlasConfig(r=4))
    small.save_pretrained(tmp_path)
    large = AutoModelForCausalLM.from_pretrained(tiny_kit.model_dir("qwen3", "large"))
    with pytest.raises(ValueError, match="base model of another width"):
        PeftModel.from_pretrained(large, tmp_path)
