"""A small byte-level BPE tokenizer trained locally, with pad/eos tokens and a ChatML chat template.

Byte-level pre-tokenisation means any text encodes (no unknown tokens), like GPT-2, Llama 3 or Qwen;
the template marks assistant turns with `{% generation %}` so TRL's `assistant_only_loss` works.

>>> from kinfolk.testing import build_tokenizer
>>> tok = build_tokenizer()
>>> tok.decode(tok("2 + 3 = 5")["input_ids"])
'2 + 3 = 5'
"""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

EOS_TOKEN = "<|im_end|>"
PAD_TOKEN = "<|pad|>"
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", EOS_TOKEN, PAD_TOKEN)

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'assistant' %}"
    "{{ '<|im_start|>assistant\\n' }}{% generation %}{{ message['content'] + '<|im_end|>' }}{% endgeneration %}"
    "{{ '\\n' }}"
    "{% else %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# Fixed text, so the merges (and therefore every token id) are the same on every machine and Python version.
_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "What is the sum of 12 and 7? The answer is 19.",
    "Reverse the word 'stone': enots. Sort the letters of 'cab': abc.",
    "def add(a, b):\n    return a + b\n",
    "for i in range(10):\n    print(i * i)\n",
    "A model learns a new skill while its answers on retained work move less.",
    "Question: how many legs does a spider have? Answer: eight.",
    "0 1 2 3 4 5 6 7 8 9 + - * / = ( ) [ ] { } : ; , . ! ? ' \"",
    "user assistant system You are a helpful assistant.",
    "Translate to French: good morning -> bonjour. Thank you -> merci.",
]


def build_tokenizer(vocab_size: int = 384, corpus: list[str] | None = None) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer on `corpus` (a fixed built-in text by default) and wrap it for transformers."""
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(corpus or _CORPUS * 20, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        model_max_length=512,
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def save_tokenizer(tokenizer: PreTrainedTokenizerFast, directory: str | Path) -> Path:
    directory = Path(directory)
    tokenizer.save_pretrained(directory)
    return directory
