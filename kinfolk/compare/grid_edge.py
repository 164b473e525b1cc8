"""A warning when a chosen value sits at its grid's end: the best value may lie beyond it, so the choice is only as
good as the grid, and the user should extend it before reading the comparison (the lab protocol flags the same,
`kinfolk.stats.on_grid_edge`). The warning names the option and the grid to pass next: the given values and one
more step beyond the chosen end, the same ratio as the grid's last step there.

>>> print(edge_warning("atlas", "--learning_rates", 3e-3, [1e-3, 3e-3]))
atlas: the chosen --learning_rates 0.003 is the largest of its grid (0.001 0.003); a larger one may do better: extend the grid, e.g. --learning_rates 0.001 0.003 0.009
>>> edge_warning("lora", "--learning_rates", 1e-3, [1e-4, 1e-3, 1e-2]) is None
True
"""

from __future__ import annotations

from collections.abc import Sequence

from kinfolk.stats import on_grid_edge


def extended_grid(chosen: float, grid: Sequence[float]) -> list[float]:
    """`grid` with one more value beyond `chosen`'s end, one step (the grid's ratio at that end) further."""
    ordered = sorted(grid)
    if chosen >= ordered[-1]:
        return [*ordered, ordered[-1] * ordered[-1] / ordered[-2]]
    return [ordered[0] * ordered[0] / ordered[1], *ordered]


def edge_warning(method: str, option: str, chosen: float, grid: Sequence[float]) -> str | None:
    """One warning line when `chosen` is the smallest or largest value of `grid` (two values or more), else None."""
    if not on_grid_edge(chosen, sorted(grid)):
        return None
    ordered = sorted(grid)
    end = "largest" if chosen >= ordered[-1] else "smallest"
    beyond = "larger" if end == "largest" else "smaller"
    values = " ".join(f"{value:.3g}" for value in ordered)
    suggestion = " ".join(f"{value:.3g}" for value in extended_grid(chosen, grid))
    return (
        f"{method}: the chosen {option} {chosen:.3g} is the {end} of its grid ({values}); a {beyond} one may do "
        f"better: extend the grid, e.g. {option} {suggestion}"
    )
