"""kinfolk: ATLANTIS weighted SFT, ATLAS adapters and ADAPT merges for the Hugging Face training stack.

Importing the package registers kinfolk's PEFT tuner types, so adapters saved by kinfolk load with
`PeftModel.from_pretrained` once `import kinfolk` has run. The registration happens when PEFT itself is imported
(at once if it already is), so commands that never touch PEFT do not pay for importing it and transformers.

>>> import kinfolk
>>> kinfolk.__version__
'0.1.0'
"""

__version__ = "0.1.0"

from kinfolk._after_import import call_after_import


def _register_peft_tuners() -> None:
    # Importing the tuner package registers the ATLAS PEFT type (idempotent).
    import kinfolk.plugins.atlas  # noqa: F401


call_after_import("peft", _register_peft_tuners)
