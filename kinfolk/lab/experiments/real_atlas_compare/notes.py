"""The plan's notes: why this design, what the pilot saw, and what the runs cost (written before any unit ran)."""

NOTES = [
    "Version 2 of the real-checkpoint ATLAS question (issue 49), written after version 1's results were seen: version "
    "1 measured 4 rows per retained source, chose Output-KL's strength on the edge of its grid and had its own "
    "selection rule. Here every run is trained and measured by kinfolk compare's code (for each arm of a seed a "
    "planned comparison: its plan.json before its runs, --test_split, three retained sources, --eval_points, "
    "--retained_nll, --method_learning_rates) and each seed is judged by compare's analysis (the one matching rule; "
    "the point found on validation, the drift read on test). A seed's per-unit value is its compare verdict's ratio "
    "(one seed), so the intervals and Holm's correction over the five seeds are the protocol's over compare's "
    "numbers.",
    "Data, per seed (drawn from pools by the seed, a module's or topic's chunks and a sonnet's halves never in two "
    "splits): 64 validation and 64 test rows of the target (standard-library Python modules, 384 training rows: "
    "what 48 steps of 8 read) and of each retained source: the model's own greedy answers (48 tokens) to 264 chat "
    "instructions (KL on the answer), the Sonnets in halves, the standard library's documentation topics in chunks; "
    "32 training rows per retained source (the ATLAS fit and Output-KL's rows). Rows of at most 96 tokens (a chat "
    "row is at most 93). The seeds share the model, the pools and the adapters' placement; the intervals do not "
    "cover those.",
    "Methods at ATLAS's placement and rank 16 (layer 14's attention output projection): LoRA (the baseline), ATLAS, "
    "its norm-matched control and LoRA + Output-KL, each at its own learning rate (compare's "
    "--method_learning_rates). Output-KL's strength is chosen per seed on validation by compare's rate rule over "
    "0.3, 1 and 3 (least validation drift at 50 % of LoRA's gain), the grid extended by one step beyond the chosen "
    "end while the choice sits on an edge, at most twice; a choice still on the edge flags its comparisons.",
    "Measured at steps 0, 1, 2, 4, 7, 13, 25 and 48 (geometric: dense where the target rises). Drift: the geometric "
    "mean over the three sources of KL(frozen || current) per token. PEFT's forgetting figure (a source's NLL per "
    "token where the run reaches the level minus at step 0) is exploratory beside the KL.",
    "PILOT",
    "COST",
]
