"""The lab's character-level tokenizer: one token per printable ASCII character, defined, not trained.

A fixed alphabet makes every token id the same on every machine, and one token per character keeps the
skills' answers (digits, letters) aligned with tokens, so a small model learns them in a few hundred steps.
Characters outside the alphabet (in the standard-library text of the corpus) become `<unk>`.

>>> tok = build_lab_tokenizer()
>>> ids = tok("12+34=")["input_ids"]
>>> len(ids), tok.decode(ids)
(6, '12+34=')
>>> len(tok) < 110
True
"""

from __future__ import annotations

import string

from tokenizers import Tokenizer, decoders, models
from transformers import PreTrainedTokenizerFast

from kinfolk.testing.tokenizer import EOS_TOKEN, PAD_TOKEN

UNK_TOKEN = "<unk>"
SPECIAL_TOKENS = (PAD_TOKEN, EOS_TOKEN, UNK_TOKEN)
ALPHABET = "\n" + "".join(chr(code) for code in range(32, 127))  # newline + printable ASCII (space .. ~)
MAX_LENGTH = 64


def build_lab_tokenizer() -> PreTrainedTokenizerFast:
    """A character-level tokenizer over `ALPHABET` with pad, EOS (`<|im_end|>`) and unknown tokens."""
    vocab = {token: index for index, token in enumerate(SPECIAL_TOKENS)}
    vocab.update({char: len(SPECIAL_TOKENS) + index for index, char in enumerate(ALPHABET)})
    # BPE without merges splits any text into its characters; Fuse joins them back without separators.
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=UNK_TOKEN))
    backend.add_special_tokens(list(SPECIAL_TOKENS))
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        unk_token=UNK_TOKEN,
        model_max_length=MAX_LENGTH,
        clean_up_tokenization_spaces=False,
    )


assert set(string.ascii_lowercase + string.digits) <= set(ALPHABET)
