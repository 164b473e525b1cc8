"""`kinfolk lab build|experiment ...`: the lab's own command line (`kinfolk.lab.cli`), reached through the verb table."""

from kinfolk.lab.cli import main

__all__ = ["main"]
