"""`kinfolk demo [--quick] [--out DIR]`: the three methods on the lab's family, measured against its ground truth.

Reads top to bottom, one stage per method, each built from kinfolk's own components:

1. family: `build_family` (or the cache);
2. ATLANTIS: one family of `kinfolk lab experiment atlantis`, through its own code: every pool cell scored and its
   weights compared with the cell's estimand, then `WeightedSFTTrainer` trains the large base on one cell's pool
   (`atlantis_cell`, by default responses sampled from the reference model, Eq. 7's own setting) with uniform
   weights, the estimand (oracle), the library's default formula and the same weights permuted;
3. ATLAS: `fit_atlas` on retained (copying) data, then an ATLAS and a LoRA adapter at the same placement and rank
   learn the target skill (reversal), measured at checkpoints for retained KL(frozen ‖ current) and the target score
   (the code of `kinfolk lab experiment atlas`: two of its methods, one learning rate, one family); their retained KL
   is compared where both rise above the frozen model's target score, and only there;
4. ADAPT: one family of `kinfolk lab experiment adapt` at the demo's budget: `kinfolk distil` (two phases) of each
   variant's and the base's student, the base's delta applied to each variant (`kinfolk merge`), every size patched
   back both ways and measured against direct distillation and cross-patching, and `kinfolk route` over the sizes;
5. evaluation: every trained model on every skill (greedy, own evaluator) and with the lab's lm-eval tasks;
6. `report.md`, `results.json` and PNG plots in `--out`; the headline table is printed.

Models the report's numbers come from are kept under `--out/models` (ADAPT's under `--out/adapt`, each size's
measurements beside it).
"""

from __future__ import annotations

import dataclasses
import sys
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from kinfolk import console
from kinfolk.atomic import check_destination, write_json
from kinfolk.lab.methods.adapt import AdaptSettings
from kinfolk.lab.methods.atlantis import AtlantisSettings
from kinfolk.lab.world.evaluate import skill_scores
from kinfolk.lab.world.family import Family, LabConfig, build_family
from kinfolk.lab.world.skills import HELD_OUT, RETAINED, TARGET
from kinfolk.plugins.atlantis.config import WeightConfig

RESULTS_FILE = "results.json"


@dataclass
class DemoConfig:
    """Budgets of the demo's runs (steps, not seconds) and the methods' settings."""

    seed: int = field(default=0, metadata={"help": "Seed of the family and of every run."})
    quick: bool = field(default=False, metadata={"help": "Use the quick family and budgets."})
    pool_size: int = field(default=1536, metadata={"help": "Rows of each SFT pool ATLANTIS scores."})
    atlantis_cell: str = field(
        default="pr",
        metadata={"help": "Pool the SFT runs train on (`kinfolk.lab.methods.atlantis.CELLS`; 'pr': Eq. 7's own)."},
    )
    atlantis_formula: str = field(
        default=WeightConfig.formula,
        metadata={"help": "ATLANTIS formula of the weighted run (the library's default)."},
    )
    atlantis_temperature: float = field(
        default=WeightConfig.temperature, metadata={"help": "Temperature of the ATLANTIS weights (the default)."}
    )
    sft_steps: int = field(default=150, metadata={"help": "Steps of each SFT run on the pool."})
    sft_learning_rate: float = field(default=1e-3, metadata={"help": "Learning rate of the pool SFT runs."})
    adapter_rank: int = field(default=32, metadata={"help": "Rank of the ATLAS and LoRA adapters."})
    adapter_layer: int = field(default=3, metadata={"help": "Decoder layer both adapters sit on."})
    adapter_module: str = field(default="self_attn.o_proj", metadata={"help": "Linear module both adapters adapt."})
    atlas_regions: int = field(default=8, metadata={"help": "Atlas regions (k-means clusters)."})
    adapter_steps: int = field(default=600, metadata={"help": "Steps of each adapter run."})
    adapter_learning_rate: float = field(default=1e-2, metadata={"help": "Learning rate of the adapter runs."})
    drift_points: int = field(
        default=40,
        metadata={
            "help": "Checkpoints of each adapter run where retained KL and target score are measured, spaced "
            "geometrically from step 1 (`kinfolk.callbacks.schedule.geometric_steps`), so a rise is drawn whether it takes 10 steps or 100 "
            "(8 evenly spaced ones left the skill learned between two of them)."
        },
    )
    distil_steps: int = field(default=300, metadata={"help": "Steps of the ADAPT base-student distillation."})
    distil_learning_rate: float = field(default=2e-3, metadata={"help": "Learning rate of the distillation."})
    kl_examples: int = field(default=256, metadata={"help": "Examples of each ADAPT size's KL to its variant."})
    eval_problems: int = field(default=200, metadata={"help": "Test problems per skill for every score."})
    lm_eval_limit: int | None = field(default=None, metadata={"help": "Problems per lm-eval task (None: all 200)."})

    @classmethod
    def quick_config(cls, **overrides) -> DemoConfig:
        """The `--quick` budgets (what CI runs): every stage and every kind of output on the quick family, at
        budgets that show the pipeline works end to end, not what the methods can do (the full demo and the
        experiments do that)."""
        quick = {
            "quick": True,
            "pool_size": 256,
            "sft_steps": 20,
            "adapter_steps": 40,
            "drift_points": 8,
            "distil_steps": 20,
            "kl_examples": 64,
            "eval_problems": 50,  # routing: 10 problems per length and split
            "lm_eval_limit": 50,
        }
        return cls(**(quick | overrides))

    def family_config(self) -> LabConfig:
        return LabConfig.quick_config(seed=self.seed) if self.quick else LabConfig(seed=self.seed)

    def adapt_settings(self) -> AdaptSettings:
        """The experiment's settings for the demo's one family: one budget for every distillation."""
        return AdaptSettings(
            budgets=[self.distil_steps],
            steps=self.distil_steps,
            learning_rate=self.distil_learning_rate,
            eval_problems=self.eval_problems,
            validation_problems=self.eval_problems,
            routing_problems=self.eval_problems // 5,
            kl_examples=self.kl_examples,
        )

    def atlantis_settings(self) -> AtlantisSettings:
        """The experiment's settings for the demo's one run: one cell, the default formula at one temperature."""
        return AtlantisSettings(
            pool_size=self.pool_size,
            steps=self.sft_steps,
            learning_rate=self.sft_learning_rate,
            temperatures=[self.atlantis_temperature],
            diagnostic_temperatures=[self.atlantis_temperature],
            formulas=[self.atlantis_formula],
            training_cells=[self.atlantis_cell],
            eval_problems=self.eval_problems,
            validation_problems=self.eval_problems,
        )


def load_saved(path: Path):
    """A saved model or PEFT adapter (ATLAS, LoRA) as the report's numbers are computed from it: from disk."""
    from peft import AutoPeftModelForCausalLM
    from transformers import AutoModelForCausalLM

    is_adapter = (Path(path) / "adapter_config.json").exists()
    return (AutoPeftModelForCausalLM if is_adapter else AutoModelForCausalLM).from_pretrained(path)


class Progress:
    """Stage lines with the time since the demo started: on the terminal of `kinfolk.console.quiet` when the
    command runs one (the libraries' output then goes to its log), else on stderr."""

    def __init__(self, enabled: bool = True):
        self.enabled, self.start = enabled, time.perf_counter()

    def __call__(self, message: str) -> None:
        if not self.enabled:
            return
        if console.active() is not None:
            console.stage(message)
        else:
            print(f"[kinfolk demo {time.perf_counter() - self.start:6.1f}s] {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------------- ATLANTIS
def atlantis_stage(family: Family, config: DemoConfig, out: Path, say: Progress) -> dict[str, Any]:
    """One family of `kinfolk lab experiment atlantis`, through the experiment's own code, on one pool cell."""
    from datasets import Dataset

    from kinfolk.lab.methods.atlantis import atlantis_family, formula_weights

    settings = config.atlantis_settings()
    say(
        f"ATLANTIS: pools of {settings.pool_size} rows scored with the large base, small base and reference; SFT of "
        f"the large base on the {config.atlantis_cell!r} pool: uniform, oracle, {config.atlantis_formula} weights "
        f"and the same weights permuted ({settings.steps} steps each)"
    )
    record = atlantis_family(family, out / "atlantis", settings, keep_models=out / "models")
    scored = Dataset.load_from_disk(str(out / "atlantis" / "run0" / config.atlantis_cell / "scored"))
    weights = formula_weights(scored, config.atlantis_formula, settings, config.atlantis_temperature)
    kinds = np.asarray(scored["kind"])
    return {
        "settings": dataclasses.asdict(settings),
        "cell": config.atlantis_cell,
        "run": record["runs"][0],
        "weights_by_kind": {kind: weights[kinds == kind].tolist() for kind in ("good", "off_format", "wrong")},
    }


# ---------------------------------------------------------------------------------------------------- ATLAS
def atlas_stage(family: Family, config: DemoConfig, out: Path, say: Progress) -> dict[str, Any]:
    from kinfolk.callbacks.schedule import geometric_steps
    from kinfolk.lab.methods.atlas import AtlasSettings, analyse_target, prepare, train_run

    tokenizer = family.tokenizer()
    settings = AtlasSettings(
        targets=[TARGET],
        methods=["lora", "atlas"],
        learning_rates=[config.adapter_learning_rate],
        steps=config.adapter_steps,
        rank=config.adapter_rank,
        layer=config.adapter_layer,
        module=config.adapter_module,
        regions=config.atlas_regions,
        validation_problems=config.eval_problems,
        eval_problems=config.eval_problems,
    )
    context = prepare(family, settings)
    frozen = {split: context.frozen_score(TARGET, split) for split in ("validation", "test")}
    results: dict[str, Any] = {
        "scores": {"large_base": family.scores["large_base"]},
        "retained_kl": {},
        "target_curve": {},
        "runs": {},
    }
    for method in ("atlas", "lora"):
        say(
            f"ATLAS: {method} adapter (rank {config.adapter_rank}, layer {context.layer} {config.adapter_module}) "
            f"learns {TARGET} ({config.adapter_steps} steps)"
            + (f", atlas of {config.atlas_regions} regions fitted on retained data first" if method == "atlas" else "")
        )
        saved = out / "models" / method
        run = train_run(context, TARGET, method, config.adapter_learning_rate, keep_model=saved, measure_at_start=True,
                        checkpoint_steps=geometric_steps(config.adapter_steps, config.drift_points))  # fmt: skip
        results["runs"][method] = run
        results["retained_kl"][method] = [[p["step"], p["test"]["kl"]] for p in run["points"]]
        results["target_curve"][method] = [[p["step"], p["test"]["target"]] for p in run["points"]]
        results["scores"][method] = skill_scores(
            load_saved(saved), tokenizer, n=config.eval_problems, seed=config.seed
        )
    # the experiment's comparison on this one run of each: levels are fractions of LoRA's gain over the frozen score,
    # so where LoRA does not rise above it there is no level and no ratio
    record = {"frozen": {TARGET: frozen}, "runs": {TARGET: {m: results["runs"][m] for m in ("lora", "atlas")}}}
    results["analysis"] = analyse_target(record, TARGET)
    return results


# ---------------------------------------------------------------------------------------------------- ADAPT
def adapt_stage(family: Family, config: DemoConfig, out: Path, say: Progress) -> dict[str, Any]:
    """One family of `kinfolk lab experiment adapt`, through its own code, at the demo's budget: `kinfolk distil`
    (two phases) of each variant and of the base (two-phase and single-phase deltas), `kinfolk merge` (apply-delta,
    patch --all both ways, delta-cosine) and `kinfolk route` over the instruct variant's families."""
    import shutil

    from kinfolk.lab.methods.adapt import adapt_family

    settings = config.adapt_settings()
    say(
        f"ADAPT: two-phase distillation ({settings.steps} steps) of each variant's and the base's student, the "
        "base's delta applied to each variant, every size patched back both ways, routing over the sizes"
    )
    record = adapt_family(family, out / "adapt", settings, progress=say.enabled)
    for method, entry in record["routing"].items():
        shutil.copyfile(Path(entry["out"]) / "frontier.png", out / f"adapt_routing_{method}.png")
    return {"settings": dataclasses.asdict(settings), **record}


# ---------------------------------------------------------------------------------------------------- lm-eval
def lm_eval_stage(family: Family, config: DemoConfig, out: Path, say: Progress) -> dict[str, dict[str, float]]:
    from kinfolk.lab.world.tasks import evaluate_with_lm_eval

    tokenizer = family.tokenizer()
    models = {name: family.models[name] for name in ("large_base", "large_instruct")}
    models.update({path.name: path for path in sorted((out / "models").iterdir())})
    results = {}
    say(f"lm-eval: kinfolk_lab_* tasks on the two large models and the {len(models) - 2} trained above")
    for name, path in console.bar(iterable=models.items(), total=len(models), desc="lm-eval", disable=not say.enabled):
        results[name] = evaluate_with_lm_eval(load_saved(path), tokenizer, limit=config.lm_eval_limit)
    return results


# ---------------------------------------------------------------------------------------------------- driver
def run_demo(
    out: str | Path,
    config: DemoConfig | None = None,
    cache_dir: str | Path | None = None,
    overwrite: bool = False,
    progress: bool = True,
    family: Family | None = None,
    allow_failed_family: bool = False,
) -> dict[str, Any]:
    """Run every stage, write `results.json`, `report.md` and plots to `out`; returns the results.

    `family` skips the build (tests pass a tiny one); by default the family of `config` is built or loaded."""
    from kinfolk.lab.demo.report import headline_table, write_report

    config = config or DemoConfig()
    out = check_destination(out, overwrite)
    out.mkdir(parents=True, exist_ok=True)
    say = Progress(progress)
    family = family or build_family(
        config.family_config(), cache_dir=cache_dir, progress=progress, allow_failed=allow_failed_family
    )
    timings: dict[str, float] = {}
    results: dict[str, Any] = {
        "config": dataclasses.asdict(config),
        "family": {
            "root": str(family.root),
            "scores": family.scores,
            "checks": family.checks,
            "passed": family.passed,
            "warning": family.warning(),
        },
        "skills": {"retained": RETAINED, "target": TARGET, "held_out": HELD_OUT},
    }
    timings["family"] = time.perf_counter() - say.start
    for name, stage in (
        ("atlantis", atlantis_stage),
        ("atlas", atlas_stage),
        ("adapt", adapt_stage),
        ("lm_eval", lm_eval_stage),
    ):
        start = time.perf_counter()
        results[name] = stage(family, config, out, say)
        timings[name] = time.perf_counter() - start
    results["seconds"] = {name: round(value, 1) for name, value in timings.items()}
    results["seconds"]["total"] = round(time.perf_counter() - say.start, 1)
    write_json(out / RESULTS_FILE, results)
    write_report(results, out)
    say("done")  # the command names the report last
    if family.warning():
        console.show(family.warning())
    console.show(headline_table(results))
    console.show(
        textwrap.fill(
            "These numbers are one family and one run of each method: a reading of this run, not an effect. An "
            "effect is claimed only where a primary endpoint over 5 families survives Holm's correction: "
            "docs/results.md († a sentence written after the results).",
            console.WIDTH,
        )
    )
    return results
