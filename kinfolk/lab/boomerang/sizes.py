"""Every size between a student and its teacher, built in memory, and each size measured against the teacher.

`patched_sizes` takes the plan `kinfolk merge patch --all` writes from (`plan_patch(..., all_sizes=True)`) and
builds each output model in memory from the same planned tensors (`materialise`), so a curve of 17 sizes costs no
disk; a test checks a built size against the one `merge patch` writes. `measure` gives, per held-out source, the
mean per-token negative log-likelihood (log perplexity), KL(teacher ‖ model) per token and top-1 agreement with the
token the teacher's row has there (on chat rows: the teacher's own greedy answer), all teacher-forced on the same
positions. The teacher's log-probabilities are computed once (`TeacherReference`) and reused for every size.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from kinfolk.plugins.adapt.config import PatchConfig
from kinfolk.plugins.adapt.execute import materialise
from kinfolk.plugins.adapt.plan import ModelPlan, plan_patch

BATCH = 4
ORDERS = ("front-to-back", "back-to-front")


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


def build_size(model_plan: ModelPlan, inputs) -> torch.nn.Module:
    """One planned output model in memory, from exactly the tensors `merge patch` would write."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(model_plan.config, dtype=torch.float32)
    state = {tensor.name: materialise(tensor, inputs) for tensor in model_plan.tensors}
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = {f"{inputs['teacher'].layout.lm_head}.weight"} if model_plan.config.tie_word_embeddings else set()
    if set(missing) - tied or unexpected:
        raise RuntimeError(f"patched size: missing {sorted(set(missing) - tied)}, unexpected {sorted(unexpected)}")
    model.tie_weights()
    return model.eval()


def patched_sizes(teacher: str | Path, student: str | Path, order: str) -> Iterator[tuple[dict, torch.nn.Module]]:
    """(summary, model) for k = 0..M patched blocks in `order`; the summary is the plan's (k, num_layers, ...)."""
    plan = plan_patch(PatchConfig(teacher=str(teacher), student=str(student), order=order), all_sizes=True)
    for model_plan in plan.models:
        model = build_size(model_plan, plan.inputs)
        summary = {
            "k": model_plan.summary["k"],
            "depth": model_plan.summary["num_layers"],
            "parameters": sum(p.numel() for p in model.parameters()),
        }
        yield summary, model
