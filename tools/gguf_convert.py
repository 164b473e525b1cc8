"""A joined GGUF checkpoint dequantised into an fp32 safetensors model directory that reloads tensor-equal, in a
child process of its own (its peak memory is the model's alone, and all of it is freed afterwards)."""

from __future__ import annotations

import concurrent.futures
import contextlib
import multiprocessing
import time
from pathlib import Path

from kinfolk import __version__
from tools.real_model_sources import RealModelError


def convert_gguf(gguf_path: str | Path, destination: str | Path, trl_chat_template: str | None = None) -> dict:
    """Dequantise a GGUF checkpoint into an fp32 safetensors model directory and check it reloads identically.

    transformers refuses to `save_pretrained` a GGUF-loaded model, so the weights move into a plain model
    built from the same config (less its `quantization_config`). Returns facts about the model for the
    provenance record.
    """
    import resource

    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_path, destination = Path(gguf_path), Path(destination)
    started = time.perf_counter()
    source_kwargs = {"gguf_file": gguf_path.name}
    tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, **source_kwargs)
    template_source = "gguf"
    if trl_chat_template is not None and tokenizer.chat_template is None:
        from trl import chat_template_utils

        tokenizer.chat_template = getattr(chat_template_utils, f"{trl_chat_template}_chat_template")
        template_source = f"trl {trl_chat_template}.jinja (the GGUF carries none)"
    source = AutoModelForCausalLM.from_pretrained(gguf_path.parent, dtype=torch.float32, **source_kwargs)
    config = source.config
    del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(source.state_dict(), strict=True)
    model.generation_config = source.generation_config
    del source
    model.save_pretrained(destination)
    tokenizer.save_pretrained(destination)

    reloaded = AutoModelForCausalLM.from_pretrained(destination, dtype=torch.float32)
    expected, actual = model.state_dict(), reloaded.state_dict()
    differing = sorted(
        name for name in expected if name not in actual or not torch.equal(expected[name], actual[name])
    )
    if differing or set(actual) != set(expected):
        raise RealModelError(f"the saved model does not reload tensor-equal: {differing[:5]}")
    sample = "Hello, world! def f(x):\n    return x ** 2  # ünïcødé"
    if AutoTokenizer.from_pretrained(destination)(sample)["input_ids"] != tokenizer(sample)["input_ids"]:
        raise RealModelError("the saved tokenizer does not encode like the GGUF's")
    embeddings, head = model.get_input_embeddings(), model.get_output_embeddings()
    return {
        "model_type": config.model_type,
        "architecture": type(model).__name__,
        "parameters": sum(parameter.numel() for parameter in model.parameters()),
        "vocab_size": config.vocab_size,
        "tokenizer_size": len(tokenizer),
        "tied_embeddings": head is not None and head.weight.data_ptr() == embeddings.weight.data_ptr(),
        "dtype": "float32",
        "chat_template_source": template_source if tokenizer.chat_template else "none",
        "bos_token": tokenizer.bos_token,
        "eos_token": tokenizer.eos_token,
        "pad_token": tokenizer.pad_token,
        "conversion_seconds": round(time.perf_counter() - started, 1),
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "versions": {
            "kinfolk": __version__,
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "gguf": _version_of("gguf"),
        },
    }


def _version_of(package: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    with contextlib.suppress(PackageNotFoundError):
        return version(package)
    return None


def convert_in_fresh_process(gguf_path: Path, destination: Path, trl_chat_template: str | None) -> dict:
    """Convert in a child process: its peak RSS is this model's alone and all its memory is freed afterwards."""
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        try:
            return pool.submit(convert_gguf, gguf_path, destination, trl_chat_template).result()
        except concurrent.futures.process.BrokenProcessPool as error:
            raise RealModelError(f"the conversion of {gguf_path.name} died (out of memory?): {error}") from error
