"""kinfolk: ATLANTIS weighted SFT, ATLAS adapters and ADAPT merges for the Hugging Face training stack.

kinfolk's PEFT tuner types (ATLAS) are registered in every Python process of an environment where kinfolk is
installed: the package installs a `.pth` startup line (see setup.py) that imports this module, which asks for the
registration to run when PEFT itself is imported (at once if it already is). So `PeftModel.from_pretrained`,
`AutoPeftModelForCausalLM` and `lm_eval --model hf --model_args peft=...` load ATLAS adapters with no
`import kinfolk` in the script, and processes that never touch PEFT do not pay for importing it and torch.

This module runs at every interpreter start: it must stay this small and import nothing heavy (tests check it).

>>> import kinfolk
>>> kinfolk.__version__
'0.1.0'
"""

__version__ = "0.1.0"

from kinfolk._after_import import call_after_import


def _register_peft_tuners() -> None:
    # Runs inside every `import peft` of the environment: a failure must not break PEFT for everyone else.
    try:
        import kinfolk.plugins.atlas  # noqa: F401  (importing the tuner package registers the ATLAS type)
    except Exception as error:
        import warnings

        warnings.warn(
            f"kinfolk could not register its ATLAS PEFT type ({error!r}); ATLAS adapters will not load", stacklevel=2
        )


call_after_import("peft", _register_peft_tuners)
