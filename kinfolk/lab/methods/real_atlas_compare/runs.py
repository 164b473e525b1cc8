"""One seed of real-atlas version 2, every run trained and measured by `kinfolk compare`'s own code.

A seed's data are drawn from the pools into data folders (`data.write_seed_data`). Each arm is a planned `kinfolk
compare` on the seed's data: the main arm (LoRA, ATLAS and its norm-matched control over the rate grid) and one
arm per Output-KL strength (LoRA against LoRA + Output-KL; its LoRA runs are the main arm's, copied in). Each
method trains at its own rates (compare's `--method_learning_rates`). `kinfolk.compare.plan.fix_plan` writes (or checks) each arm's `plan.json` before its runs,
`CompareRuns` checks the inputs, and `kinfolk.compare.grid.run_grid` trains and measures each run into
`work/seed-<seed>/<arm>/runs/<method>/lr-<rate>/seed-<seed>/` with compare's claims, so two processes started
alike share a seed's runs and each is trained once. Output-KL's strength is chosen on validation
(`verdicts.choose_strength`, compare's rule) and its grid extended one step while the choice sits on an edge.

The seed's record (`records/<seed>/record.json`) holds, per run, its checkpoints as compare reads them from its
`drift.jsonl` (validation: target and drift; test: target, drift, every source's KL and NLL); each run's
`drift.jsonl`, `run.json` and `answers.jsonl` are copied beside it with the names drawn (`drawn.json`), so the
record can be recomputed from them (`compare_curves`). Each run is kept there as soon as it ends, and a work folder
that lacks a kept run gets it back before its arm trains (`kept`): a seed's runs outlive the machine they ran on.
"""

from __future__ import annotations

import os
import shutil
from functools import cached_property
from pathlib import Path
from typing import Any

from kinfolk.atomic import write_json
from kinfolk.claims import CLAIM_FILE
from kinfolk.compare import grid
from kinfolk.compare.grid import RunKey
from kinfolk.lab.methods.real_atlas_compare import data
from kinfolk.lab.methods.real_atlas_compare.kept import CHAT_ANSWERS, KeptRuns, share_pool_file
from kinfolk.lab.methods.real_atlas_compare.settings import BASELINE, OUTPUT_KL, RealAtlasCompareSettings
from kinfolk.lab.protocol.records import kept_path, kept_record

RECORD_VERSION = 1
PROG = "kinfolk lab experiment real-atlas-compare run"


def arm_name(coef: float | None = None) -> str:
    """An arm's folder in a seed's work directory: the main arm, or the Output-KL arm at strength `coef`.

    >>> arm_name(), arm_name(3.0)
    ('main', 'output-kl-3')
    """
    return "main" if coef is None else f"output-kl-{coef:g}"


def record_key(seed: int) -> str:
    return f"{seed}/record"


class RealAtlasCompareRuns:
    """The pools (the chat answers made once by the frozen model) and each seed's arms."""

    record_version = RECORD_VERSION
    record_key = staticmethod(record_key)

    def __init__(self, settings: RealAtlasCompareSettings):
        self.settings = settings
        self.work = Path(settings.work)
        self.model_dir = settings.model_dir()
        if not (self.model_dir / "config.json").exists():
            raise FileNotFoundError(f"{self.model_dir}: no model there (run `make real-models`)")
        share_pool_file(settings.records, self.work, CHAT_ANSWERS)  # made by an earlier process, kept or not yet

    # ------------------------------------------------------------------------------------------ data
    @cached_property
    def tokenizer(self):
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(self.model_dir)

    @cached_property
    def answers(self) -> dict[str, str]:
        """The frozen model's greedy answer to every chat instruction (under the work folder, kept in the records)."""
        import torch
        from transformers import AutoModelForCausalLM

        from kinfolk.lab.methods.real_corpus import chat_instructions
        from kinfolk.lab.world.heldout import kept_answers

        path = self.work / CHAT_ANSWERS
        instructions = chat_instructions(self.settings.chat_prompts)
        model = None if path.exists() else AutoModelForCausalLM.from_pretrained(self.model_dir, dtype=torch.float32)
        answers = kept_answers(path, model, self.tokenizer, instructions, self.settings.answer_tokens)
        share_pool_file(self.settings.records, self.work, CHAT_ANSWERS)
        return answers

    @cached_property
    def pools(self) -> dict[str, dict[str, str]]:
        from kinfolk.lab.methods.real_corpus import chat_instructions, code_texts, doc_chunks

        prose = self.settings.prose_path()
        chat = {f"chat:{instruction}": instruction for instruction in chat_instructions(self.settings.chat_prompts)}
        return {"code": code_texts(), "chat": chat, "prose": data.prose_items(prose), "docs": doc_chunks()}

    def chat_row(self, name: str) -> dict:
        """The instruction in the chat template, and the model's own answer (with the template's end of turn)."""
        from kinfolk.lab.world.heldout import chat_text

        instruction = self.pools["chat"][name]
        prompt = chat_text(self.tokenizer, instruction, None)
        whole = chat_text(self.tokenizer, instruction, self.answers[instruction])
        if not whole.startswith(prompt):
            raise ValueError(f"{self.model_dir}: the chat template's answer does not follow its prompt")
        return {"prompt": prompt, "completion": whole[len(prompt) :]}

    def seed_data(self, seed: int) -> tuple[Path, dict[str, dict[str, list[str]]]]:
        """The seed's data folder and the names drawn into it."""
        s, folder = self.settings, self.work / f"seed-{seed}" / "data"
        drawn = data.write_seed_data(folder, seed, self.pools, s.held_out_rows, s.fit_rows, s.max_steps * s.batch_size,
                                     self.chat_row)  # fmt: skip
        return folder, drawn

    # ------------------------------------------------------------------------------------------ arms
    def arm_args(self, seed: int, coef: float | None = None):
        """The `CompareArguments` of one arm of the seed, a planned comparison on the seed's data: the main arm
        (every method but Output-KL) or, with `coef`, LoRA against LoRA + Output-KL at that strength; each method at
        its own rates."""
        from kinfolk.compare.options import CompareArguments

        s = self.settings
        folder, _ = self.seed_data(seed)
        methods = [m for m in s.methods if m != OUTPUT_KL] if coef is None else [BASELINE, OUTPUT_KL]
        own = [f"{m}={','.join(f'{rate:g}' for rate in s.learning_rates[m])}" for m in methods if m != BASELINE]
        return CompareArguments(
            model_name_or_path=str(self.model_dir),
            dataset_name=str(folder / data.TARGET),
            retained_dataset_name=[f"{source}={folder / source}" for source in data.RETAINED],
            out=str(self.work / f"seed-{seed}" / arm_name(coef)),
            methods=methods,
            baseline=BASELINE,
            learning_rates=s.learning_rates[BASELINE],
            method_learning_rates=own,
            seeds=[seed],
            plan=True,
            levels=s.levels,
            selection_fraction=s.selection_fraction,
            **({} if coef is None else {"output_kl_coef": coef}),
            **s.compare_options(),
        )

    def arm(self, seed: int, coef: float | None = None) -> dict[RunKey, Path] | None:
        """Train (or read back) one arm's runs by compare's plan and grid, each run kept in the records as it ends
        and put back from there first: their folders, or None while another process trains one. An Output-KL arm
        reuses the main arm's finished LoRA run (the same settings), so it waits (None) until that run is kept."""
        from kinfolk.compare.plan import fix_plan
        from kinfolk.compare.runs import CompareRuns
        from kinfolk.console import LOG_FILE, quiet, stage

        args = self.arm_args(seed, coef)
        out, kept = Path(args.out), KeptRuns(self.settings.records, seed)
        keys = grid.run_keys(args.methods, args.rate_grid(), args.seeds)
        kept.restore_plan(arm_name(coef), out)
        for key in keys:
            kept.restore_run(kept_name(key, coef), key.folder(out))
        fix_plan(args, out, sum(key.folder(out).exists() for key in keys))
        kept.keep_plan(out, arm_name(coef))
        if coef is not None and not all(self._lora_copied(key, out) for key in keys if key.method == BASELINE):
            return None
        if any(grid.read_record(key.folder(out)) is None for key in keys):
            stage(f"seed {seed}: {arm_name(coef)}")
        runs = CompareRuns(args)
        with quiet(out / LOG_FILE, PROG, verbose=False):
            for key in runs.keys:  # one run at a time, so each is kept the moment it ends
                grid.run_grid([key], out, runs.settings, args.max_steps, runs.train, runs.load)
                kept.keep_run(key.folder(out), kept_name(key, coef))
        folders = {key: key.folder(out) for key in keys}
        # a run another process held may have ended meanwhile (that process keeps it)
        return None if any(grid.read_record(folder) is None for folder in folders.values()) else folders

    def _lora_copied(self, key: RunKey, out: Path) -> bool:
        """Copy the main arm's finished LoRA run `key` into the Output-KL arm `out` (False: not finished yet)."""
        source, target = key.folder(self.work / f"seed-{key.seed}" / arm_name()), key.folder(out)
        if grid.read_record(target) is not None:
            return True
        if grid.read_record(source) is None:
            return False
        staging = target.with_name(f".{target.name}.{os.getpid()}")
        shutil.copytree(source, staging, ignore=shutil.ignore_patterns(CLAIM_FILE))
        staging.rename(target) if not target.exists() else shutil.rmtree(staging)
        return True

    def arms(self, seed: int) -> tuple[dict[RunKey | tuple[RunKey, float], Path], list[float]] | None:
        """Every run of the seed (Output-KL's keyed with its strength) and Output-KL's final grid, its grid extended
        while the choice sits on an edge; None while another process trains one of them."""
        from kinfolk.compare.grid_edge import extended_grid
        from kinfolk.lab.methods.real_atlas_compare.verdicts import choose_strength
        from kinfolk.stats import on_grid_edge

        s = self.settings
        # every arm is tried before giving up on the seed, so a second process trains an Output-KL strength while
        # the first holds a main-arm run or another strength: they are independent once the shared LoRA run is kept
        # (an Output-KL arm answers None until then); only the strength's choice and the grid's extension wait
        main = self.arm(seed)
        folders: dict = dict(main or {})
        coefs = list(s.output_kl_coefs)
        for extension in range(s.output_kl_extensions + 1):
            made = {coef: self.arm(seed, coef) for coef in coefs}
            if main is None or any(arm is None for arm in made.values()):
                return None
            for coef, arm in made.items():
                folders |= {(key, coef): folder for key, folder in arm.items() if key.method == OUTPUT_KL}
            chosen = choose_strength(self.curves_record(seed, folders, coefs), s.selection_fraction)
            if extension == s.output_kl_extensions or not on_grid_edge(chosen, sorted(coefs)):
                break
            coefs = extended_grid(chosen, coefs)
        return folders, sorted(coefs)

    # ------------------------------------------------------------------------------------------ record
    def curves_record(self, seed: int, folders: dict, coefs: list[float]) -> dict[str, Any]:
        """The seed's record from its runs' folders (`compare_curves` of each), named by their place."""
        return {
            "record_version": RECORD_VERSION,
            "seed": seed,
            "model": self.settings.model,
            "output_kl_coefs": sorted(coefs),
            "runs": {run_name(key): compare_curves(folder, seed) for key, folder in folders.items()},
        }

    def record(self, seed: int) -> dict[str, Any] | None:
        """The seed's record, kept with its runs' files once every arm has finished; None while another process
        trains one of them."""
        kept = kept_record(self.settings.records, record_key(seed), RECORD_VERSION)
        if kept is not None:
            return kept
        made = self.arms(seed)
        if made is None:
            return None
        folders, coefs = made
        record = self.curves_record(seed, folders, coefs)
        path, kept = kept_path(self.settings.records, record_key(seed)), KeptRuns(self.settings.records, seed)
        for key, folder in folders.items():
            kept.keep_run(folder, run_name(key))
        write_json(path.parent / "drawn.json", self.seed_data(seed)[1])
        write_json(path, record)
        return record


def run_name(key) -> str:
    """A run's name in a seed's record: `method/lr-<rate>`, Output-KL's with `/kl-<strength>`.

    >>> run_name(grid.RunKey("atlas", 0.01, 0)), run_name((grid.RunKey("lora_output_kl", 0.003, 0), 3.0))
    ('atlas/lr-0.01', 'lora_output_kl/lr-0.003/kl-3')
    """
    if isinstance(key, tuple):
        key, coef = key
        return f"{key.method}/lr-{key.rate}/kl-{coef:g}"
    return f"{key.method}/lr-{key.rate}"


def kept_name(key: RunKey, coef: float | None) -> str:
    """The run name under which an arm's run `key` is kept: Output-KL's runs with the arm's strength, the LoRA run
    every arm shares without.

    >>> kept_name(grid.RunKey("lora", 0.003, 0), 3.0)
    'lora/lr-0.003'
    """
    return run_name((key, coef) if key.method == OUTPUT_KL else key)


def compare_curves(folder: Path, seed: int) -> dict[str, Any]:
    """One arm's run as compare reads it (`kinfolk.compare.measures.read_curves`, `kinfolk.compare.grid.RunRecord`):
    validation (step, target, drift), test (step, target, drift), each retained source's test (step, target, KL),
    and each source's test NLL per step (PEFT's forgetting: after minus before)."""
    from kinfolk.compare.grid import read_record
    from kinfolk.compare.measures import read_curves
    from kinfolk.drift.log import read_rows, steps

    run = read_record(folder)
    sources = list(data.RETAINED)
    curves = read_curves(run.method, seed, folder, sources, test=True)
    rows = steps(read_rows(folder))
    return {
        "method": run.method,
        "learning_rate": run.learning_rate,
        "output_kl_coef": (run.setting_values or {}).get("output_kl_coef"),
        "seconds": run.seconds,
        "validation": [list(point) for point in sorted(curves.validation.checkpoints)],
        "test": {
            "drift": [list(point) for point in sorted(curves.test.checkpoints)],
            "sources": {source: [list(p) for p in sorted(curves.sources[source].checkpoints)] for source in sources},
            "nll": {
                source: {
                    str(step): row[f"test/retained_nll/{source}"]
                    for step, row in rows.items()
                    if f"test/retained_nll/{source}" in row
                }
                for source in sources
            },
        },
    }
