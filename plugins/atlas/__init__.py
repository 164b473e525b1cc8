"""ATLAS adapters: a PEFT tuner type whose low-rank residual is centred, scaled and filtered per token by an atlas of
the frozen model's activations on retained data. Importing this package registers the `ATLAS` PEFT type, so adapters
load with `PeftModel.from_pretrained` and `AutoPeftModelForCausalLM`; kinfolk's startup hook imports it whenever
PEFT is imported, in every process of an environment where kinfolk is installed (see `kinfolk/__init__.py`).

>>> from peft import get_peft_model
>>> from kinfolk.plugins.atlas import AtlasConfig
>>> from kinfolk.testing import build_model
>>> model = get_peft_model(build_model("llama"), AtlasConfig(r=4, residual="atlas"))
>>> model.print_trainable_parameters()  # doctest: +ELLIPSIS
trainable params: 256 || all params: ...
"""

from kinfolk.peft_types import register_tuner
from kinfolk.plugins.atlas.config import AtlasConfig
from kinfolk.plugins.atlas.fit import fit_atlas
from kinfolk.plugins.atlas.layer import AtlasLayer, AtlasLinear
from kinfolk.plugins.atlas.model import AtlasModel

__all__ = ["AtlasConfig", "AtlasLayer", "AtlasLinear", "AtlasModel", "fit_atlas"]

register_tuner(name="atlas", config_cls=AtlasConfig, model_cls=AtlasModel, prefix="atlas_")
