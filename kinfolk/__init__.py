"""kinfolk: ATLANTIS weighted SFT, ATLAS adapters and ADAPT merges for the Hugging Face training stack.

Importing the package registers kinfolk's PEFT tuner types, so adapters saved by kinfolk load with
`PeftModel.from_pretrained` once `import kinfolk` has run. Nothing else heavy happens at import time.

>>> import kinfolk
>>> kinfolk.__version__
'0.1.0'
"""

__version__ = "0.1.0"

# Registers the ATLAS PEFT type (idempotent), so `PeftModel.from_pretrained` can load kinfolk adapters.
from kinfolk.plugins import atlas as _atlas  # noqa: F401
