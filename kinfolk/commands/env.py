"""`kinfolk env`: what a bug report needs — the stack's versions, the torch device, bf16 support, and which
kinfolk tuner types PEFT knows about.

>>> from kinfolk.commands.env import collect_environment
>>> sorted(collect_environment())[:3]  # doctest: +SKIP
['bf16_supported', 'cuda_devices', 'device']
"""

from __future__ import annotations

import json
import platform
from dataclasses import dataclass, field
from importlib import metadata

from kinfolk.commands.parsing import VerbParser

STACK = (
    "kinfolk",
    "torch",
    "transformers",
    "trl",
    "peft",
    "accelerate",
    "datasets",
    "evaluate",
    "lm_eval",
    "safetensors",
    "tokenizers",
    "numpy",
    "matplotlib",
    "mergekit",
)


def _version(distribution: str) -> str:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "not installed"


def registered_peft_plugins() -> dict[str, str]:
    """PEFT tuner types whose config class comes from kinfolk, as {peft type: config class path}."""
    from peft.mapping import PEFT_TYPE_TO_CONFIG_MAPPING

    import kinfolk  # noqa: F401  (importing kinfolk is what registers its tuner types)

    return {
        str(getattr(peft_type, "value", peft_type)): f"{config.__module__}.{config.__qualname__}"
        for peft_type, config in PEFT_TYPE_TO_CONFIG_MAPPING.items()
        if config.__module__.startswith("kinfolk.")
    }


def collect_environment() -> dict[str, object]:
    import torch

    cuda = torch.cuda.is_available()
    if cuda:
        device = "cuda"
        bf16 = torch.cuda.is_bf16_supported()
    else:
        device = "cpu"
        bf16 = False  # CPUs only emulate bf16 (autocast, slow); kinfolk's trainers default to fp32 there
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "versions": {name: _version(name) for name in STACK},
        "device": device,
        "cuda_devices": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if cuda else [],
        "bf16_supported": bf16,
        "torch_threads": torch.get_num_threads(),
        "peft_plugins": registered_peft_plugins(),
    }


def format_environment(env: dict[str, object]) -> str:
    lines = [f"{'python':<14} {env['python']}  ({env['platform']})"]
    lines += [f"{name:<14} {version}" for name, version in env["versions"].items()]
    devices = ", ".join(env["cuda_devices"]) or "none"
    lines.append(f"{'device':<14} {env['device']}  (CUDA devices: {devices}; torch threads: {env['torch_threads']})")
    if env["bf16_supported"]:
        bf16 = "supported"
    elif env["device"] == "cpu":
        bf16 = "CPU: emulated only; kinfolk sft and distil train in fp32 here unless --bf16 true"
    else:
        bf16 = "not supported by this GPU; kinfolk sft and distil train in fp32"
    lines.append(f"{'bf16':<14} {bf16}")
    plugins = env["peft_plugins"]
    listed = ", ".join(f"{name} ({path})" for name, path in plugins.items()) if plugins else "none registered"
    lines.append(f"{'peft plugins':<14} {listed}")
    return "\n".join(lines)


@dataclass
class EnvArguments:
    json: bool = field(default=False, metadata={"help": "print one JSON object instead of a table"})


def main(argv: list[str] | None = None) -> int:
    (args,) = VerbParser(EnvArguments, prog="kinfolk env", description=__doc__.split("\n\n")[0]).parse(argv)
    env = collect_environment()
    print(json.dumps(env, indent=2) if args.json else format_environment(env))
    return 0
