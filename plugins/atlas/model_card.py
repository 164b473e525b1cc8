"""The ATLAS part of an adapter's model card: kinfolk, its version and how to load the adapter.

PEFT writes `README.md` next to a saved adapter with `library_name: peft` and nothing that says the `ATLAS` type
comes from kinfolk, so whoever finds the adapter cannot tell what to install. `AtlasConfig.save_pretrained` (which
PEFT calls after it has written the card) adds the `kinfolk` and `atlas` tags and one section, replaced on every
save so the version stays current.

>>> import tempfile
>>> from pathlib import Path
>>> folder = Path(tempfile.mkdtemp())
>>> write_atlas_card(folder)
>>> card = (folder / "README.md").read_text()
>>> "kinfolk" in card.split("---")[1], f"saved with kinfolk {kinfolk.__version__}" in card
(True, True)
"""

from __future__ import annotations

import re
from pathlib import Path

import kinfolk
from kinfolk.atomic import atomic_file

CARD_NAME = "README.md"
CARD_TAGS = ("kinfolk", "atlas")
_START, _END = "<!-- kinfolk:atlas -->", "<!-- /kinfolk:atlas -->"

SECTION = """{start}
## Loading this ATLAS adapter

An ATLAS adapter (PEFT type `ATLAS`), saved with kinfolk {version}. PEFT itself does not define the type: install
kinfolk where the adapter is loaded (`pip install "kinfolk>={version}"`), and every Python process of that
environment registers ATLAS with PEFT, with no `import kinfolk` needed:

```python
from peft import AutoPeftModelForCausalLM

model = AutoPeftModelForCausalLM.from_pretrained("{path}")
# or, onto a base model you loaded: PeftModel.from_pretrained(base_model, "{path}")
```

With lm-eval: `lm_eval --model hf --model_args pretrained=<base model>,peft={path} --tasks ...`
{end}"""


def write_atlas_card(directory: str | Path) -> None:
    """Add kinfolk's tags and loading section to `directory`'s model card (created if PEFT wrote none)."""
    from huggingface_hub import ModelCard, ModelCardData

    path = Path(directory) / CARD_NAME
    card = ModelCard.load(path) if path.is_file() else ModelCard.from_template(ModelCardData(library_name="peft"))
    card.data.tags = sorted({*(card.data.tags or []), *CARD_TAGS})
    section = SECTION.format(start=_START, end=_END, version=kinfolk.__version__, path="path/to/this/adapter")
    pattern = re.compile(re.escape(_START) + ".*?" + re.escape(_END), re.DOTALL)
    text, replaced = pattern.subn(lambda _: section, card.text)
    card.text = text if replaced else text.rstrip("\n") + "\n\n" + section + "\n"
    with atomic_file(path) as handle:
        handle.write(str(card))
