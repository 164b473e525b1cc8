"""The options kinfolk's messages tell a user to pass, registered with the verbs that print them, so a test can
hold every hint to the parser of each verb that prints it (a hint a verb refuses, such as "pass --bf16 true" printed
by a verb without `--bf16`, sends the user from one error to the next). A message builds its hint with `suggest`
where the module is imported; `HINTS` maps each hint to those verbs.

>>> note = f"training in fp32 (pass {suggest('--bf16 true', 'sft', 'distil')} for CPU bf16 autocast)"
>>> note, sorted(HINTS["--bf16 true"])
('training in fp32 (pass --bf16 true for CPU bf16 autocast)', ['distil', 'sft'])
"""

from __future__ import annotations

HINTS: dict[str, set[str]] = {}  # hint (options as typed) -> the verbs that print it ("merge patch": verb and op)


def suggest(options: str, *verbs: str) -> str:
    """`options` as the message shows them, registered under `verbs` (each one accepts them)."""
    HINTS.setdefault(options, set()).update(verbs)
    return options
