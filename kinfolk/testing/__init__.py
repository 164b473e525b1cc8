"""Offline tiny-model kit: a locally trained tokenizer, tiny random causal LMs of every supported architecture
and tiny SFT datasets. Nothing here touches the network; everything builds in seconds on a CPU.

>>> import tempfile
>>> from transformers import AutoModelForCausalLM
>>> from kinfolk.testing import TinyKit
>>> path = TinyKit(tempfile.mkdtemp()).model_dir("gemma2", "small")
>>> AutoModelForCausalLM.from_pretrained(path).config.model_type
'gemma2'

`python -m kinfolk.testing --out DIR` writes every architecture's family to DIR.
"""

from kinfolk.testing.data import (
    conversational_dataset,
    conversational_prompt_completion_dataset,
    prompt_completion_dataset,
    text_dataset,
)
from kinfolk.testing.kit import TinyKit
from kinfolk.testing.models import ARCHITECTURES, SIZES, build_model, perturbed_copy, save_model, tiny_config
from kinfolk.testing.tokenizer import CHAT_TEMPLATE, EOS_TOKEN, PAD_TOKEN, build_tokenizer, save_tokenizer

__all__ = [
    "ARCHITECTURES",
    "CHAT_TEMPLATE",
    "EOS_TOKEN",
    "PAD_TOKEN",
    "SIZES",
    "TinyKit",
    "build_model",
    "build_tokenizer",
    "conversational_dataset",
    "conversational_prompt_completion_dataset",
    "perturbed_copy",
    "prompt_completion_dataset",
    "save_model",
    "save_tokenizer",
    "text_dataset",
    "tiny_config",
]
