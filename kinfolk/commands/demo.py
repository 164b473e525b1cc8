"""`kinfolk demo [--quick] --out DIR`: ATLANTIS, ATLAS and ADAPT on the lab family (`kinfolk.lab.demo`)."""

from kinfolk.lab.demo import main

__all__ = ["main"]
