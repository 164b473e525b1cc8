"""`kinfolk lab experiment adapt --seeds N`: ADAPT's transfers against direct distillation of each variant, per size.

Per seed (distillation data order and initialisation of every distillation; the family stays the one of
`--family_seed`), `kinfolk.lab.demo.adapt_stage` distils the base student from the teacher, applies the weight delta
(distilled − init) to each post-trained variant's layer-dropped student, and patches every size back towards the
variant (`patch --all`: k = 0 is the delta-transferred student, k = M the variant itself). Two baselines per size:

- cross-patch (the paper's compute-matched baseline): the same patching of variant blocks into the distilled *base*
  student, without the delta (k = 0 is the distilled base student itself);
- direct distillation (the paper's upper bound, below the teacher's size only): the variant's own student of the
  same layers distilled directly from the variant, with the same steps, data and seed (what the transfer saves).

Every model is measured on the variant's style: accuracy (correct answer in the variant's format) over the
post-trained skills' test problems, and KL(variant ‖ model) over the response tokens of the variant's own data.
Differences transfer − baseline are summarised over seeds with a percentile bootstrap (`kinfolk.stats`);
`results.json`, `results.md` and every model go to `--out`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from kinfolk.lab.family import POST_TRAINED_SKILLS, Family, LabConfig
from kinfolk.lab.report import markdown_table
from kinfolk.lab.seeded import run_over_seeds, seeds_title
from kinfolk.lab.training import lab_distil
from kinfolk.stats import bootstrap_interval


def teacher_kl(model, teacher, batches: list[dict[str, torch.Tensor]]) -> float:
    """KL(teacher ‖ model) per response token, pooled over `batches` (`kinfolk.divergence`)."""
    from kinfolk.divergence import ReferenceModel, token_divergence

    total, count = 0.0, 0
    with torch.no_grad():
        for batch in batches:
            result = token_divergence(
                model, batch["input_ids"], batch["attention_mask"], batch["labels"], frozen=ReferenceModel(teacher)
            )
            total += float(result.values[result.mask].sum())
            count += int(result.mask.sum())
    return total / count


def measure(path: Path, teacher, batches, family: Family, eval_problems: int, seed: int, format_index: int) -> dict:
    """Accuracy in the variant's style per post-trained skill, their mean, and KL to the variant (`teacher`)."""
    from transformers import AutoModelForCausalLM

    from kinfolk.lab.evaluate import skill_scores

    model = AutoModelForCausalLM.from_pretrained(path)
    scores = skill_scores(model, family.tokenizer(), POST_TRAINED_SKILLS, eval_problems, seed, format_index)
    return {
        "path": str(path),
        "layers": model.config.num_hidden_layers,
        "accuracy": float(np.mean([scores[skill]["accuracy"] for skill in POST_TRAINED_SKILLS])),
        "scores": scores,
        "teacher_kl": teacher_kl(model, teacher, batches),
    }


def adapt_seed(family: Family, seed: int, out: Path, settings: dict[str, Any]) -> dict[str, Any]:
    """The transfers of `adapt_stage` and the direct distillations of one seed, every model measured."""
    from transformers import AutoModelForCausalLM

    from kinfolk.callbacks.retained_kl import retained_batches
    from kinfolk.lab.demo import DemoConfig, Progress, adapt_stage
    from kinfolk.plugins.adapt import merge

    root = out / f"seed-{seed}"
    config = DemoConfig(
        seed=seed,
        distil_steps=settings["distil_steps"],
        distil_learning_rate=settings["distil_learning_rate"],
        eval_problems=settings["eval_problems"],
    )
    print(f"[kinfolk lab experiment adapt] seed {seed}: delta transfer and patching", flush=True)
    stage = adapt_stage(family, config, root, Progress(False))
    variants = {}
    for name, entry in stage["variants"].items():
        variant, format_index = family.variants[name], entry["format_index"]
        teacher = AutoModelForCausalLM.from_pretrained(variant)
        batches = retained_batches(
            family.instruct_data(settings["kl_examples"], format_index=format_index), family.tokenizer()
        )
        cross = root / "adapt" / f"cross-{name}"
        merge(
            {
                "op": "patch",
                "teacher": str(variant),
                "student": str(root / "adapt" / "distilled-base"),
                "order": "back-to-front",
                "allow_other_teacher": True,  # the cross-patch: the variant's blocks into the base's student
            },
            cross,
            True,
            all_sizes=True,
            progress=False,
        )
        sizes = json.loads((root / "adapt" / f"family-{name}" / "family.json").read_text())["models"]
        cross_sizes = json.loads((cross / "family.json").read_text())["models"]
        rows = []
        for size, cross_size in zip(sizes, cross_sizes, strict=True):
            assert cross_size["teacher_layers"] == size["teacher_layers"]  # one layer map, one patching order
            transfer = root / "adapt" / f"family-{name}" / size["dir"]
            row = {
                "k": size["k"],
                "teacher_layers": size["teacher_layers"],
                "transfer": measure(transfer, teacher, batches, family, config.eval_problems, seed, format_index),
                "cross_patch": measure(
                    cross / cross_size["dir"], teacher, batches, family, config.eval_problems, seed, format_index
                ),
            }
            if size["teacher_layers"] != list(range(teacher.config.num_hidden_layers)):
                print(
                    f"[kinfolk lab experiment adapt] seed {seed}: {name} distilled directly at layers "
                    f"{size['teacher_layers']}",
                    flush=True,
                )
                init = root / "direct" / f"init-{name}-{size['dir']}"
                merge(
                    {"op": "init-student", "teacher": str(variant), "layers": {"layers": size["teacher_layers"]}},
                    init,
                    True,
                    progress=False,
                )
                direct = lab_distil(
                    init,
                    variant,
                    family.pretraining(32 * config.distil_steps),
                    family.tokenizer(),
                    root / "direct" / f"{name}-{size['dir']}",
                    config.distil_steps,
                    config.distil_learning_rate,
                    seed=seed,
                    progress=False,
                )
                row["direct"] = measure(direct, teacher, batches, family, config.eval_problems, seed, format_index)
            rows.append(row)
        variants[name] = {"format_index": format_index, "sizes": rows}
    return {"variants": variants}


def _interval(values: list[float]) -> dict[str, float]:
    return bootstrap_interval(lambda x: float(x.mean()), values).as_dict()


def summarise(per_seed: list[dict[str, Any]]) -> dict[str, Any]:
    """Per variant and size, over seeds: accuracy and KL of the transfer and of each baseline, and transfer − baseline."""
    summary: dict[str, Any] = {}
    for name, entry in per_seed[0]["variants"].items():
        sizes = []
        for index, row in enumerate(entry["sizes"]):
            seeds = [seed["variants"][name]["sizes"][index] for seed in per_seed]
            cell: dict[str, Any] = {"k": row["k"], "layers": row["transfer"]["layers"]}
            for metric in ("accuracy", "teacher_kl"):
                cell[metric] = {"transfer": _interval([s["transfer"][metric] for s in seeds])}
                for baseline in BASELINES:
                    if baseline in row:
                        cell[metric][baseline] = _interval([s[baseline][metric] for s in seeds])
                        cell[metric][f"transfer - {baseline}"] = _interval(
                            [s["transfer"][metric] - s[baseline][metric] for s in seeds]
                        )
            sizes.append(cell)
        summary[name] = sizes
    return summary


def _cell(entry: dict[str, float] | None, digits: int = 3) -> str:
    if entry is None:
        return "—"
    return f"{entry['estimate']:.{digits}f} [{entry['low']:.{digits}f}, {entry['high']:.{digits}f}]"


def markdown(results: dict[str, Any]) -> list[str]:
    settings = results["settings"]
    body = [
        seeds_title("ADAPT", len(results["seeds"])),
        f"Family `{results['family']}` (family seed {results['family_seed']}); every distillation "
        f"{settings['distil_steps']} steps at lr {settings['distil_learning_rate']} on the pre-training mix; accuracy in "
        f"the variant's format over {' + '.join(POST_TRAINED_SKILLS)} ({settings['eval_problems']} test problems each); "
        f"KL(variant ‖ model) per response token over {settings['kl_examples']} of the variant's own examples. "
        "k = 0 is the delta-transferred student (cross-patch: the distilled base student), k > 0 puts k variant "
        "blocks back, the largest k is the variant itself; direct distillation exists below the variant's size only. "
        "Mean over seeds with bootstrap 95 % intervals over seeds.",
    ]
    for name, sizes in results["summary"].items():
        for metric, title, digits in (("accuracy", "accuracy", 3), ("teacher_kl", "KL(variant ‖ model)", 4)):
            columns = ["transfer", *BASELINES, *(f"transfer - {baseline}" for baseline in BASELINES)]
            rows = [
                [cell["k"], cell["layers"], *(_cell(cell[metric].get(column), digits) for column in columns)]
                for cell in sizes
            ]
            headers = ["k", "layers", *(column.replace("_", "-").replace(" - ", " − ") for column in columns)]
            body += [f"Variant `{name}`, {title}:", markdown_table(headers, rows)]
    return body


BASELINES = ("cross_patch", "direct")
DEFAULTS = {"distil_steps": 300, "distil_learning_rate": 2e-3, "eval_problems": 200, "kl_examples": 256}
QUICK = {"distil_steps": 80, "eval_problems": 100}


def run_adapt(
    out: str | Path,
    seeds: int = 3,
    quick: bool = False,
    family_seed: int = 0,
    cache_dir: str | None = None,
    overwrite: bool = False,
    **overrides,
) -> dict[str, Any]:
    settings = DEFAULTS | (QUICK if quick else {}) | {k: v for k, v in overrides.items() if v is not None}
    return run_over_seeds(
        "adapt",
        out,
        seeds,
        LabConfig.quick_config(seed=family_seed) if quick else LabConfig(seed=family_seed),
        settings,
        lambda family, seed: adapt_seed(family, seed, Path(out), settings),
        summarise,
        markdown,
        cache_dir=cache_dir,
        overwrite=overwrite,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kinfolk lab experiment adapt", description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=3, help="number of seeds (distillation data order and init)")
    parser.add_argument("--quick", action="store_true", help="on the quick family with quick budgets")
    parser.add_argument("--family_seed", type=int, default=0, help="seed of the family")
    parser.add_argument("--cache_dir", default=None, help="lab family cache")
    parser.add_argument("--distil_steps", type=int, default=None, help=f"default {DEFAULTS['distil_steps']}")
    parser.add_argument("--eval_problems", type=int, default=None, help="test problems per skill")
    parser.add_argument("--kl_examples", type=int, default=None, help="variant examples the KL is measured on")
    parser.add_argument("--out", default="runs/lab-adapt")
    parser.add_argument("--overwrite", action="store_true")
    args = parser.parse_args(argv)
    run_adapt(
        args.out,
        args.seeds,
        args.quick,
        args.family_seed,
        args.cache_dir,
        args.overwrite,
        distil_steps=args.distil_steps,
        eval_problems=args.eval_problems,
        kl_examples=args.kl_examples,
    )
    return 0
