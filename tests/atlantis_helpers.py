"""Shared by the ATLANTIS tests: response log-probs computed the slow, obvious way, without kinfolk."""

import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


def reference_scores(model_dir, dataset) -> tuple[np.ndarray, np.ndarray]:
    """Response log-prob sums and token counts, one example at a time from full float64 logits.

    Written without kinfolk: prompt/completion rows are tokenised as prompt, then prompt + completion + EOS,
    and the response is every token after the two tokenisations' common prefix (a real BPE tokenizer merges
    across the boundary, e.g. a prompt's final "\n" with the completion's indent, so the prompt's tokens are not
    always a prefix; the trainer then trains from the first token that differs); messages rows through the chat
    template's own assistant mask.
    """
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    sums, counts = [], []
    for example in dataset:
        if "messages" in example:
            encoded = tokenizer.apply_chat_template(
                example["messages"], tokenize=True, return_dict=True, return_assistant_tokens_mask=True
            )
            ids, scored = encoded["input_ids"], encoded["assistant_masks"]
        else:
            prompt_ids = tokenizer(example["prompt"])["input_ids"]
            ids = tokenizer(example["prompt"] + example["completion"] + tokenizer.eos_token)["input_ids"]
            common = 0
            while common < min(len(prompt_ids), len(ids)) and prompt_ids[common] == ids[common]:
                common += 1
            scored = [0] * common + [1] * (len(ids) - common)
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids])).logits[0].double()
        log_probs = torch.log_softmax(logits, dim=-1)
        positions = [t for t in range(1, len(ids)) if scored[t]]
        sums.append(sum(log_probs[t - 1, ids[t]].item() for t in positions))
        counts.append(len(positions))
    return np.array(sums), np.array(counts)
