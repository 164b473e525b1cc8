"""The pilot of the real-atlas experiment: one seed that is not a unit, measured on validation only, chooses each
method's learning rate (of three) and Output-KL's strength (of three, at LoRA's chosen rate) before the plan is
written.

The rule (`selection.choose_run`), the same for every method, LoRA included: the level is the high fraction of the
best validation gain any LoRA run reaches, and a method's rate (Output-KL's strength) is the one whose checkpoint
at that level drifts least on validation (the highest-reaching one when none reaches it). A first version chose
LoRA's rate as the one reaching the highest gain; LoRA's pilot runs showed that this hands LoRA its largest rate,
which reaches the level with more drift than a smaller one, so the rule was made the same for all before the plan. `choose` returns the choices and the evidence;
`kinfolk lab experiment real-atlas run --pilot` writes them to `docs/results/real-atlas-units/pilot.json`.
"""

from __future__ import annotations

from typing import Any

from kinfolk.lab.experiments.real_atlas.runs import RealAtlasRuns, run_name
from kinfolk.lab.experiments.real_atlas.settings import BASELINE, PILOT_OUTPUT_KL_COEFS, PILOT_RATES
from kinfolk.lab.methods import selection

PILOT_SEED = 100  # not a unit: the units are the plan's seeds
PILOT_LEVEL = "high"


def _validation(run: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"step": p["step"], **p["validation"]} for p in run["points"]]


def pilot_runs(runs: RealAtlasRuns, methods: list[str]) -> dict[str, dict[str, Any] | None]:
    """The pilot's runs of `methods` by name (None: another process's, still running). Output-KL's run at LoRA's
    chosen rate, so they wait for every LoRA run: LoRA comes first in `methods`."""
    done: dict[str, dict[str, Any] | None] = {}
    for method in methods:
        if method == "lora+output-kl":
            lora = {run_name(BASELINE, r, None): runs.run(PILOT_SEED, BASELINE, r) for r in PILOT_RATES[BASELINE]}
            if any(run is None for run in lora.values()):
                done[method] = None
                continue
            curves = {name: _validation(run) for name, run in lora.items()}
            level = selection.pilot_level(curves, runs.settings.gain_levels[PILOT_LEVEL])
            rate = lora[selection.choose_run(curves, level)]["learning_rate"]
            for coef in PILOT_OUTPUT_KL_COEFS:
                done[run_name(method, rate, coef)] = runs.run(PILOT_SEED, method, rate, coef)
            continue
        for rate in PILOT_RATES[method]:
            done[run_name(method, rate, None)] = runs.run(PILOT_SEED, method, rate)
    return done


def choose(runs: RealAtlasRuns) -> dict[str, Any]:
    """Every method's learning rate and Output-KL's strength, from the pilot seed's validation checkpoints."""
    s = runs.settings
    every = pilot_runs(runs, list(s.methods))
    if any(run is None for run in every.values()):
        raise RuntimeError("the pilot's runs are not all kept yet")
    by_method: dict[str, dict[str, list]] = {}
    for name, run in every.items():
        by_method.setdefault(run["method"], {})[name] = _validation(run)
    level = selection.pilot_level(by_method[BASELINE], s.gain_levels[PILOT_LEVEL])
    chosen = {method: selection.choose_run(named, level) for method, named in by_method.items()}
    return {
        "seed": PILOT_SEED,
        "level": {"name": PILOT_LEVEL, "validation_gain": level},
        "learning_rates": {method: every[name]["learning_rate"] for method, name in chosen.items()},
        "output_kl_coef": every[chosen["lora+output-kl"]]["strength"],
        "runs": {
            name: {
                "method": run["method"],
                "learning_rate": run["learning_rate"],
                "strength": run["strength"],
                "trainable": run["trainable"],
                "best_validation_gain": selection.best_score(_validation(run)),
                "checkpoint_at_level": selection.checkpoint_at(_validation(run), level),
                "validation": _validation(run),
            }
            for name, run in every.items()
        },
    }
