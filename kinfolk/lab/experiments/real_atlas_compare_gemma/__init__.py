"""real-atlas version 2 on Gemma-3-270m: `experiment`, `settings`, `notes`."""
