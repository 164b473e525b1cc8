"""real-atlas version 2 on Gemma-3-270m: `experiment`, `settings`, `notes`; the design it shares with the first
model is `kinfolk.lab.methods.real_atlas_compare`."""
