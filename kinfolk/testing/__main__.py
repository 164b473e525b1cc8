"""`python -m kinfolk.testing --out DIR`: build every tiny family offline and check each model generates."""

import argparse

import torch
import transformers
from transformers import AutoModelForCausalLM

from kinfolk.testing import ARCHITECTURES, TinyKit


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m kinfolk.testing", description=__doc__)
    parser.add_argument("--out", required=True, help="directory for the kit (reused when it already exists)")
    parser.add_argument("--architectures", nargs="+", default=list(ARCHITECTURES), choices=ARCHITECTURES)
    args = parser.parse_args()
    transformers.utils.logging.disable_progress_bar()
    kit = TinyKit(args.out)
    tokenizer = kit.tokenizer()
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 2 + 3?"}], add_generation_prompt=True, return_tensors="pt"
    )
    prompt_ids = prompt["input_ids"] if isinstance(prompt, dict) or hasattr(prompt, "keys") else prompt
    for architecture in args.architectures:
        for role, path in kit.family(architecture).items():
            model = AutoModelForCausalLM.from_pretrained(path)
            with torch.inference_mode():
                output = model.generate(prompt_ids, max_new_tokens=8, do_sample=False)
            params = sum(p.numel() for p in model.parameters())
            text = tokenizer.decode(output[0, prompt_ids.shape[1] :])
            print(f"{architecture:<8} {role:<15} {params:>8,} params  {path}  generates {text!r}")


if __name__ == "__main__":
    main()
