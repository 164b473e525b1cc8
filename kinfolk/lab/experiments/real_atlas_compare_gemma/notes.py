"""The second model's plan notes: why this model and design, and what its runs cost (written before any unit ran)."""

NOTES = [
    "The second real model of version 2 (issue 49): Gemma-3-270m, the base model (google/gemma-3-270m as the Q4_K_M "
    "GGUF that five PyPI packages carry, dequantised to fp32 by `make real-models`: 18 layers, width 640, a tied "
    "vocabulary of 262,144). The question, the data draw, the measures, the matching rule, the levels, the "
    "Output-KL strength grid and its extension, the budget (48 steps of 4 rows of at most 96 tokens, measured at "
    "steps 0, 1, 2, 4, 7, 13, 25 and 48) and the primaries are real-atlas-compare's on SmolLM2-135M-Instruct; so are "
    "the pools, drawn per seed by the same rule.",
    "A base model has no chat training: the chat source is its own greedy continuation (48 tokens) of each "
    "instruction in Gemma's chat template, which often repeats the instruction or a line. The KL on it still "
    "measures how far a run moves the model's own outputs; it is not a measure of chat quality.",
    "Timed before this plan (seed 999, not a unit: LoRA at 3e-3 for 2 steps measured at steps 0 and 1, one "
    "one-thread process beside three other lab processes on the two cores, a load of about 4): the 264 chat answers "
    "took 448 s once; step 0's eleven measurements, which build the frozen and prefix caches (measured from layer "
    "8 of 18), took 38 minutes with the model's load, against 7-10 minutes on SmolLM2 at a like load; a later "
    "checkpoint took about 11 minutes (one source's 64 rows 50-170 s of measuring; SmolLM2's whole checkpoint "
    "6.5-7 minutes), the head's 262,144 outputs per token (168M multiply-adds against SmolLM2's 28M) and the KL "
    "over them being the difference. A run of 48 steps measured at 8 checkpoints projects to about 2 hours at that "
    "load, about twice SmolLM2's.",
    "So the design is reduced as the issue asks when a seed projects past about 8 hours of both cores for all "
    "seeds: LoRA, ATLAS and LoRA + Output-KL, the norm-matched control left out (its primary is SmolLM2's alone). "
    "No pilot on this model fixed the rates: LoRA's and ATLAS's are chosen per seed on validation by compare's rate "
    "rule from two each (LoRA 1e-3 and 3e-3, SmolLM2's rate and one step below; ATLAS 3e-3 and 1e-2), Output-KL "
    "keeps 3e-3, its strength chosen from its grid. A seed is 4 main runs and 3 Output-KL runs (up to 5 with the "
    "grid's extensions; LoRA's runs are shared): 7-9 runs, about 14-20 process-hours; 70-100 for five seeds, 35-50 "
    "hours of both cores. No accelerator can take them here: the device machine this project is sometimes lent "
    "receives at most 64 MiB a call and reaches no package index, and the checkpoint is 1 GB in fp32 (about 250 MB "
    "as its GGUF). So the seeds run on this machine's CPU in the background across sessions, after "
    "real-atlas-compare's, each run kept as it ends; compare's --use_cpu is off so that a user with a GPU and the "
    "checkpoint runs the same plan there (fp32 on both, so no primary mixes dtypes).",
]
