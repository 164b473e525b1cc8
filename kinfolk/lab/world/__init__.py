"""The lab's world: characters, skills with known ground truth, corpora, and the model family trained on them.

Modules are named in `kinfolk.lab`'s docstring; nothing heavy is imported here.
"""
