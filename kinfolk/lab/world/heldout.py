"""Teacher-forced measurement of a model against a fixed reference model on held-out rows.

`rows_from` tokenises one source's held-out texts (on chat rows, only the answer after the prompt counts);
`TeacherReference` computes the reference's log-probabilities at every measured position once, and `measure(model)`
gives, per source, the mean per-token negative log-likelihood (log perplexity), KL(reference ‖ model) per token and
top-1 agreement with the row's next token, all on the same positions. The real-checkpoint experiments use it with the
teacher as reference (every patched size of a student) and with the frozen model as reference (every adapter
checkpoint: its retained drift). `chat_text` and `greedy_answers` make the chat rows: a model's own greedy answers.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

BATCH = 4


@dataclass(frozen=True)
class MeasurementRows:
    """One source's held-out rows, right-padded: `measured[i, t]` says whether token t+1 of row i is scored."""

    source: str
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    measured: torch.Tensor

    def batches(self) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        for start in range(0, len(self.input_ids), BATCH):
            part = slice(start, start + BATCH)
            yield self.input_ids[part], self.attention_mask[part], self.measured[part]


@dataclass(frozen=True)
class SourceMeasure:
    nll: float  # mean negative log-likelihood per measured token (log perplexity)
    kl: float  # mean KL(teacher ‖ model) per measured token, nats
    agreement: float  # share of measured positions where the model's top token is the row's next token


def rows_from(source: str, tokenizer, texts: Sequence[str], prefixes: Sequence[str] | None, max_length: int):
    """Tokenised rows; with `prefixes` (the chat prompt of each text) only the tokens after the prefix count."""
    ids, measured = [], []
    for index, text in enumerate(texts):
        tokens = tokenizer(text, add_special_tokens=False)["input_ids"][:max_length]
        start = len(tokenizer(prefixes[index], add_special_tokens=False)["input_ids"]) if prefixes else 1
        row_measured = [start - 1 <= t < len(tokens) - 1 for t in range(len(tokens))]
        if not any(row_measured):
            raise ValueError(f"{source} row {index}: nothing to measure within {max_length} tokens")
        ids.append(tokens)
        measured.append(row_measured)
    width = max(map(len, ids))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    return MeasurementRows(
        source,
        torch.tensor([row + [pad] * (width - len(row)) for row in ids]),
        torch.tensor([[1] * len(row) + [0] * (width - len(row)) for row in ids]),
        torch.tensor([row + [False] * (width - len(row)) for row in measured]),
    )


class TeacherReference:
    """The teacher's log-probabilities at every measured position of every source, computed once."""

    def __init__(self, teacher, rows: Sequence[MeasurementRows]):
        self.rows = list(rows)
        self.log_probs = {part.source: torch.cat(list(_log_probs(teacher, part))) for part in self.rows}

    @torch.no_grad()
    def measure(self, model) -> dict[str, SourceMeasure]:
        result = {}
        for part in self.rows:
            teacher = self.log_probs[part.source]
            nll = kl = agree = 0.0
            offset = 0
            for (input_ids, _, measured), ours in zip(part.batches(), _log_probs(model, part)):
                targets = input_ids[:, 1:][measured[:, :-1]]
                theirs = teacher[offset : offset + len(ours)]
                offset += len(ours)
                # per position in fp32 (KLs here are far above its rounding), summed over positions in fp64
                nll -= ours.gather(1, targets[:, None]).double().sum().item()
                kl += (theirs.exp() * (theirs - ours)).sum(-1).double().sum().item()
                agree += (ours.argmax(-1) == targets).sum().item()
            count = len(teacher)
            result[part.source] = SourceMeasure(nll / count, kl / count, agree / count)
        return result


@torch.no_grad()
def _log_probs(model, part: MeasurementRows) -> Iterator[torch.Tensor]:
    """log-softmax (fp32) at the measured positions, batch by batch."""
    for input_ids, attention_mask, measured in part.batches():
        logits = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits
        yield torch.log_softmax(logits[measured].float(), dim=-1)


def chat_text(tokenizer, instruction: str, answer: str | None) -> str:
    """The chat template's text of one user turn and, when given, the assistant's answer (else the prompt)."""
    messages = [{"role": "user", "content": instruction}]
    if answer is None:
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    messages.append({"role": "assistant", "content": answer})
    return tokenizer.apply_chat_template(messages, tokenize=False)


@torch.no_grad()
def greedy_answers(model, tokenizer, instructions: Sequence[str], max_new_tokens: int) -> dict[str, str]:
    """`model`'s greedy answer to every instruction, by instruction (left-padded batches of 16)."""
    answers = {}
    tokenizer.padding_side = "left"
    try:
        for start in range(0, len(instructions), 16):
            part = instructions[start : start + 16]
            batch = tokenizer([chat_text(tokenizer, i, None) for i in part], return_tensors="pt", padding=True,
                              add_special_tokens=False)  # fmt: skip
            output = model.generate(**batch, max_new_tokens=max_new_tokens, do_sample=False,
                                    pad_token_id=tokenizer.pad_token_id)  # fmt: skip
            for instruction, tokens in zip(part, output[:, batch["input_ids"].shape[1] :]):
                answers[instruction] = tokenizer.decode(tokens, skip_special_tokens=True).strip()
    finally:
        tokenizer.padding_side = "right"
    return answers


def kept_answers(path, model, tokenizer, instructions: Sequence[str], max_new_tokens: int) -> dict[str, str]:
    """`greedy_answers`, kept as JSON at `path` and read back while it holds the same instructions (the answers are
    deterministic, so a rerun or another process reuses them)."""
    import json
    from pathlib import Path

    from kinfolk import console
    from kinfolk.atomic import write_json

    path = Path(path)
    if path.exists() and list(kept := json.loads(path.read_text())) == list(instructions):
        return kept
    console.stage(f"greedy answers to {len(instructions)} instructions")
    answers = greedy_answers(model, tokenizer, instructions, max_new_tokens)
    write_json(path, answers)
    return answers
