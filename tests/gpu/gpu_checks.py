"""GPU checks of kinfolk's trainers and callbacks: bf16 on one GPU, FSDP2 and DeepSpeed ZeRO-2/3 when launched.

Run by `tests/gpu/run_gpu_checks.sh` (not by pytest: CI has no GPU). Subcommands:

    python gpu_checks.py single OUT_DIR           bf16 weighted SFT and bf16 ATLAS on one GPU (+ references)
    python gpu_checks.py launched TAG OUT_DIR     the training parts under the launcher's FSDP2 / ZeRO set-up
              [--deepspeed CONFIG.json]           (DeepSpeed goes through TrainingArguments, as HF documents)
    python gpu_checks.py summary OUT_DIR          one JSON line over every check in OUT_DIR

Each check writes OUT_DIR/<check>.json: {"check", "pass", "figures", "failures"}; a part that raises records the
error as its failure, so one broken part never hides the others. KINFOLK_GPU_CHECKS_DEVICE=cpu runs the same code
on CPU at a tiny size (a dry run of the scripts themselves, not a GPU result).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import traceback
from pathlib import Path

import torch

CPU_DRY_RUN = os.environ.get("KINFOLK_GPU_CHECKS_DEVICE") == "cpu"
STEPS = 4 if CPU_DRY_RUN else 30
MEASURE_EVERY = 2 if CPU_DRY_RUN else 10
# Big enough that bf16 rounding and sharding are realistic, small enough that a check takes seconds on an H200.
SHAPE = (
    {}
    if CPU_DRY_RUN
    else {
        "hidden_size": 512,
        "intermediate_size": 1536,
        "num_hidden_layers": 8,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 64,
        "initializer_range": 0.02,
    }
)
STEP1_TOLERANCE = {"bf16_autocast": 0.01, "bf16_weights": 0.03, "launched": 0.03}


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


def record(out: Path, check: str, figures: dict, failures: list[str]) -> None:
    if _rank() != 0:
        return
    result = {"check": check, "pass": not failures, "figures": figures, "failures": failures}
    (out / f"{check}.json").write_text(json.dumps(result, indent=2, default=str))
    print(json.dumps({"check": check, "pass": not failures, "failures": failures}), flush=True)


def guarded(out: Path, check: str, part) -> None:
    """Run `part(figures, failures)`; an exception becomes the check's failure."""
    figures: dict = {}
    failures: list[str] = []
    try:
        part(figures, failures)
    except Exception as error:
        failures.append(f"{type(error).__name__}: {error}")
        traceback.print_exc()
    record(out, check, figures, failures)


# ---- shared set-up ---------------------------------------------------------------------------------------------


def tokenizer():
    from kinfolk.testing import build_tokenizer

    return build_tokenizer()


def model(tok, dtype=torch.float32):
    from kinfolk.testing import build_model

    return build_model("llama", "large", tokenizer=tok, **SHAPE).to(dtype)


def weighted_data(n: int = 256, seed: int = 0):
    from kinfolk.testing import prompt_completion_dataset

    data = prompt_completion_dataset(n, seed=seed)
    weights = torch.empty(n).uniform_(0.2, 3.0, generator=torch.Generator().manual_seed(seed)).tolist()
    return data.add_column("weight", weights)


def retained_data():
    from kinfolk.testing import prompt_completion_dataset

    return prompt_completion_dataset(32, seed=11)


def common_args(output_dir: Path, **overrides) -> dict:
    values = {
        "output_dir": str(output_dir),
        "max_steps": STEPS,
        "per_device_train_batch_size": 8,
        "gradient_accumulation_steps": 2,
        "learning_rate": 3e-4,
        "lr_scheduler_type": "constant",
        "logging_steps": 1,
        "save_strategy": "no",
        "report_to": [],
        "seed": 0,
        "max_length": 128,
        "disable_tqdm": True,
        "use_cpu": CPU_DRY_RUN,
    }
    values.update(overrides)
    return values


def train_records(trainer) -> list[dict]:
    return [entry for entry in trainer.state.log_history if "loss" in entry]


def check_losses(records: list[dict], failures: list[str], label: str) -> list[float]:
    losses = [entry["loss"] for entry in records]
    if len(losses) != STEPS:
        failures.append(f"{label}: {len(losses)} loss records for {STEPS} steps")
    if not all(math.isfinite(loss) for loss in losses):
        failures.append(f"{label}: non-finite loss in {losses}")
    elif not CPU_DRY_RUN and sum(losses[-3:]) >= sum(losses[:3]):
        failures.append(f"{label}: the loss did not fall ({losses[:3]} ... {losses[-3:]})")
    return losses


def check_step1(loss: float, reference: float, tolerance: float, failures: list[str], label: str) -> float:
    relative = abs(loss - reference) / abs(reference)
    if relative > tolerance:
        failures.append(f"{label}: step-1 loss {loss:.5f} is {relative:.2%} from the reference {reference:.5f}")
    return relative


def weighted_trainer(output_dir: Path, tok, dtype=torch.float32, deepspeed: str | None = None, **overrides):
    from kinfolk.trainers import WeightedSFTConfig, WeightedSFTTrainer

    args = WeightedSFTConfig(**common_args(output_dir, deepspeed=deepspeed, **overrides))
    return WeightedSFTTrainer(model=model(tok, dtype), args=args, train_dataset=weighted_data(), processing_class=tok)


def atlas_trainer(output_dir: Path, tok, deepspeed: str | None = None, **overrides):
    """A bf16 base with a fitted, identity-initialised ATLAS adapter, in TRL's SFTTrainer."""
    from peft import get_peft_model
    from trl import SFTConfig, SFTTrainer

    from kinfolk.plugins.atlas import AtlasConfig, fit_atlas
    from kinfolk.testing import prompt_completion_dataset

    base = model(tok, torch.bfloat16)
    if not CPU_DRY_RUN:
        base = base.cuda()
    peft_model = get_peft_model(base, AtlasConfig(r=16, atlas_dtype="float32"))
    fit_atlas(peft_model, retained_data(), tok, batch_size=16, progress=False)
    args = SFTConfig(**common_args(output_dir, deepspeed=deepspeed, bf16=True, **overrides))
    return SFTTrainer(model=peft_model, args=args, train_dataset=prompt_completion_dataset(256), processing_class=tok)


def add_retained_kl(trainer, **options):
    from kinfolk.callbacks import RetainedKLCallback

    callback = RetainedKLCallback(trainer, retained_data(), every_n_steps=MEASURE_EVERY, batch_size=8, **options)
    trainer.add_callback(callback)
    return callback


def check_retained_kl_records(trainer, failures: list[str], label: str, identity_at_start: bool) -> dict:
    """The measured steps' records hold the trainer's loss too (callbacks no longer replace its logs)."""
    measured = {entry["step"]: entry for entry in trainer.state.log_history if "retained_kl" in entry}
    expected = [step for step in range(0, STEPS + 1, MEASURE_EVERY) if step or identity_at_start]
    if sorted(measured) != expected:
        failures.append(f"{label}: retained_kl at steps {sorted(measured)}, expected {expected}")
    for step, entry in measured.items():
        if step and not {"loss", "grad_norm", "learning_rate"} <= entry.keys():
            failures.append(f"{label}: step {step}'s record lost the trainer's metrics: {sorted(entry)}")
        if not (math.isfinite(entry["retained_kl"]) and entry["retained_kl"] >= -1e-6):
            failures.append(f"{label}: retained_kl {entry['retained_kl']} at step {step}")
    if identity_at_start and 0 in measured and abs(measured[0]["retained_kl"]) > 1e-6:
        failures.append(f"{label}: retained_kl {measured[0]['retained_kl']} at step 0 (identity adapter)")
    last = measured.get(STEPS, {}).get("retained_kl")
    if last is not None and not CPU_DRY_RUN and last <= 0:
        failures.append(f"{label}: training did not move the model on the retained data")
    return {step: entry["retained_kl"] for step, entry in sorted(measured.items())}


def refused_under_zero3(tag: str, figures: dict, failures: list[str], action) -> bool:
    """Under ZeRO-3, `action` must end in kinfolk's one-line InputError; True when the check ends there."""
    from kinfolk.errors import InputError

    if tag != "zero3":
        return False
    try:
        action()
        failures.append("accepted under ZeRO-3, where it is documented as refused")
    except InputError as error:
        figures["refusal"] = str(error)
    return True


def train_with_retained_kl(
    trainer, figures: dict, failures: list[str], label: str, identity_at_start: bool, reference: float | None = None
) -> None:
    """Train; check the losses, the retained-KL records and (launched runs) step 1 against one GPU's run."""
    trainer.train()
    figures["loss"] = check_losses(train_records(trainer), failures, label)
    figures["retained_kl"] = check_retained_kl_records(trainer, failures, label, identity_at_start)
    if reference is not None:
        tolerance = STEP1_TOLERANCE["launched"]
        figures["step1_relative_error"] = check_step1(figures["loss"][0], reference, tolerance, failures, label)


def atlas_dtypes(peft_model) -> dict[str, str]:
    from kinfolk.plugins.atlas import AtlasLayer

    dtypes = {}
    for name, module in peft_model.named_modules():
        if isinstance(module, AtlasLayer):
            for tensor_name, tensor in [*module.named_buffers(recurse=False), *module.named_parameters()]:
                if tensor_name.startswith("atlas_"):
                    dtypes[f"{name}.{tensor_name}"] = str(tensor.dtype)
    return dtypes


# ---- one GPU -------------------------------------------------------------------------------------------------


def single(out: Path) -> None:
    tok = tokenizer()
    reference: dict[str, float] = {}

    def weighted_sft_bf16(figures, failures):
        runs = {
            "fp32": weighted_trainer(out / "ws-fp32", tok, bf16=False),
            "bf16_autocast": weighted_trainer(out / "ws-bf16", tok, bf16=True),
            "bf16_weights": weighted_trainer(out / "ws-bf16w", tok, torch.bfloat16, bf16=True),
        }
        for name, trainer in runs.items():
            trainer.train()
            records = train_records(trainer)
            figures[name] = {"loss": check_losses(records, failures, name)}
            figures[name]["unweighted_loss"] = [entry.get("unweighted_loss") for entry in records]
            if any("unweighted_loss" not in entry or "weight/mean" not in entry for entry in records):
                failures.append(f"{name}: a step's record lacks unweighted_loss or weight/mean")
        fp32 = figures["fp32"]["loss"][0]
        for name in ("bf16_autocast", "bf16_weights"):
            figures[name]["step1_relative_error"] = check_step1(
                figures[name]["loss"][0], fp32, STEP1_TOLERANCE[name], failures, name
            )
        reference["weighted_step1"] = figures["bf16_autocast"]["loss"][0]

    def atlas_bf16(figures, failures):
        from peft import PeftModel

        trainer = atlas_trainer(out / "atlas", tok)
        add_retained_kl(trainer, measure_at_start=True)
        train_with_retained_kl(trainer, figures, failures, "atlas", identity_at_start=True)
        reference["atlas_step1"] = figures["loss"][0]
        peft_model = trainer.model
        dtypes = atlas_dtypes(peft_model)
        figures["atlas_dtypes"] = sorted(set(dtypes.values()))
        if set(dtypes.values()) != {"torch.float32"}:
            failures.append(f"ATLAS tensors left float32 on a bf16 base: {sorted(set(dtypes.values()))}")
        peft_model.save_pretrained(out / "atlas" / "adapter")
        ids = torch.tensor([[5, 9, 17, 33, 2, 41, 7, 12]], device=peft_model.device)
        fresh_base = model(tok, torch.bfloat16).to(peft_model.device)
        reloaded = PeftModel.from_pretrained(fresh_base, out / "atlas" / "adapter").eval()
        peft_model.eval()
        trained, loaded = peft_model.state_dict(), reloaded.state_dict()
        changed = [name for name in trained if "atlas_" in name and not torch.equal(trained[name], loaded[name])]
        if changed:
            failures.append(f"the reloaded adapter's tensors differ: {changed[:4]}")
        with torch.no_grad():  # equal weights; bf16 kernels may still round one ulp apart
            difference = (peft_model(input_ids=ids).logits - reloaded(input_ids=ids).logits).abs().max().item()
        figures["reload_max_logit_difference"] = difference
        if difference > 0.05:
            failures.append(f"the reloaded adapter's logits are {difference:.3g} from the trained adapter's")

    guarded(out, "weighted_sft_bf16", weighted_sft_bf16)
    guarded(out, "atlas_bf16", atlas_bf16)
    (out / "reference.json").write_text(json.dumps(reference))


# ---- under a distributed launcher ------------------------------------------------------------------------------


def launched(tag: str, out: Path, deepspeed: str | None) -> None:
    tok = tokenizer()
    reference = json.loads((out / "reference.json").read_text()) if (out / "reference.json").is_file() else {}
    mixed = {"bf16": True}

    def weighted(figures, failures):
        from safetensors.torch import load_file

        trainer = weighted_trainer(out / f"{tag}-weighted", tok, deepspeed=deepspeed, **mixed)
        add_retained_kl(trainer)  # full fine-tuning: the frozen side is the model at train start (ZeRO-3: gathered)
        figures["distributed_type"] = str(trainer.accelerator.distributed_type)
        figures["num_processes"] = trainer.accelerator.num_processes
        train_with_retained_kl(trainer, figures, failures, f"{tag} weighted", False, reference.get("weighted_step1"))
        trainer.save_model(str(out / f"{tag}-weighted" / "model"))
        trainer.accelerator.wait_for_everyone()
        if _rank() == 0:  # the saved tensors as stored: a from_pretrained here, on one rank, would load under the
            # live ZeRO-3 config's zero.Init and wait on collectives the other ranks never join
            saved = {}
            for shard in (out / f"{tag}-weighted" / "model").glob("*.safetensors"):
                saved.update(load_file(shard))
            figures["saved_parameters"] = sum(tensor.numel() for tensor in saved.values())
            if not saved or not all(torch.isfinite(tensor).all() for tensor in saved.values()):
                failures.append(f"{tag}: the saved model holds no weights or non-finite ones")

    def atlas(figures, failures):
        if refused_under_zero3(tag, figures, failures, lambda: atlas_trainer(out / f"{tag}-atlas", tok, deepspeed)):
            return  # the base was loaded partitioned (the weighted check's ZeRO-3 config is live): fit_atlas refuses
        trainer = atlas_trainer(out / f"{tag}-atlas", tok, deepspeed=deepspeed)
        add_retained_kl(trainer, measure_at_start=True)
        train_with_retained_kl(trainer, figures, failures, f"{tag} atlas", True, reference.get("atlas_step1"))

    def atlas_unmeasured(figures, failures):
        """Diagnostic: does ATLAS itself train under the launcher? No measurement, the base built before any ZeRO-3
        config, the forward's ZeRO-3 refusal lifted (the GPU check that made ZeRO-3 refuse ATLAS also measured it
        through weights gathered for the measurement: docs/distributed.md)."""
        from kinfolk.plugins.atlas import layer

        refusal, layer.refuse_if_zero3 = layer.refuse_if_zero3, lambda parameter: None
        try:
            trainer = atlas_trainer(out / f"{tag}-atlas-unmeasured", tok, deepspeed=deepspeed)
            trainer.train()
        finally:
            layer.refuse_if_zero3 = refusal
        figures["loss"] = check_losses(train_records(trainer), failures, f"{tag} atlas unmeasured")

    def target_metric(figures, failures):
        """TargetMetricCallback (minus the validation NLL of rows like the training rows) logs at its steps and
        rises; under ZeRO-3 it reads the head through TRL's gather, under FSDP2 with the root's weights gathered."""
        from kinfolk.callbacks import TargetMetricCallback
        from kinfolk.callbacks.target_metric import validation_nll

        trainer = weighted_trainer(out / f"{tag}-target", tok, deepspeed=deepspeed, **mixed)
        rows = weighted_data(32, seed=5).remove_columns("weight")
        measure = validation_nll(rows, tok, batch_size=8)
        trainer.add_callback(TargetMetricCallback(trainer, measure, every_n_steps=MEASURE_EVERY))
        trainer.train()
        measured = {entry["step"]: entry["target"] for entry in trainer.state.log_history if "target" in entry}
        figures["target"] = measured
        if sorted(measured) != list(range(0, STEPS + 1, MEASURE_EVERY)):
            failures.append(f"target at steps {sorted(measured)}")
        elif not all(math.isfinite(value) for value in measured.values()):
            failures.append(f"non-finite target in {measured}")
        elif not CPU_DRY_RUN and measured[STEPS] <= measured[0]:
            failures.append(f"the target did not rise: {measured}")

    def lm_eval_refusal(figures, failures):
        from kinfolk.callbacks import LmEvalCallback
        from kinfolk.errors import InputError

        trainer = weighted_trainer(out / f"{tag}-refusal", tok, deepspeed=deepspeed, **mixed)
        sharded = trainer.is_fsdp_enabled or getattr(trainer.accelerator.state.deepspeed_plugin, "zero_stage", 0) == 3
        figures["sharded"] = bool(sharded)
        try:
            LmEvalCallback(trainer, ["kinfolk_csqa_sample"])
            refused = False
        except InputError:
            refused = True
        if refused != sharded:
            failures.append(
                f"LmEvalCallback {'refused' if refused else 'accepted'} a {'' if sharded else 'un'}sharded run"
            )

    guarded(out, f"diagnostic_{tag}_atlas_unmeasured", atlas_unmeasured)  # first: before any ZeRO-3 config exists
    guarded(out, f"{tag}_weighted_sft", weighted)
    guarded(out, f"{tag}_atlas_retained_kl", atlas)
    guarded(out, f"{tag}_target_metric", target_metric)
    guarded(out, f"{tag}_lm_eval_refusal", lm_eval_refusal)


# ---- summary --------------------------------------------------------------------------------------------------


def summary(out: Path, skipped: list[str]) -> dict:
    """The one JSON line; every check's whole record (figures too) goes to OUT_DIR/records.json, one file to bring
    back from a machine that returns few (the saved models beside them are far larger)."""
    records = {}
    for path in sorted(out.glob("*.json")):
        if path.name in ("reference.json", "summary.json", "records.json"):
            continue
        result = json.loads(path.read_text())
        records[result["check"]] = result
    (out / "records.json").write_text(json.dumps(records, indent=1, default=str))
    checks = {name: {"pass": result["pass"], "failures": result["failures"]} for name, result in records.items()}
    # a diagnostic answers a question for the next change (its check names it) and does not decide the verdict
    verdict = [check["pass"] for name, check in checks.items() if not name.startswith("diagnostic_")]
    return {
        "bench": "gpu_checks",
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu (dry run)",
        "checks": checks,
        "skipped": skipped,
        "pass": bool(verdict) and all(verdict),
    }


def cli(argv: list[str] | None, description: str, run_single, run_launched) -> int:
    """The subcommands `single`, `launched` and `summary`, running `run_single(out)` / `run_launched(tag, out,
    deepspeed)` (scale_checks.py shares it with its own parts)."""
    parser = argparse.ArgumentParser(description=description)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("single").add_argument("out", type=Path)
    launch = sub.add_parser("launched")
    launch.add_argument("tag")
    launch.add_argument("out", type=Path)
    launch.add_argument("--deepspeed", default=None)
    summarise = sub.add_parser("summary")
    summarise.add_argument("out", type=Path)
    summarise.add_argument("--skipped", action="append", default=[], help="a check that could not run, and why")
    args = parser.parse_args(argv)
    if args.command != "summary" and not CPU_DRY_RUN and not torch.cuda.is_available():
        print("no CUDA device: set KINFOLK_GPU_CHECKS_DEVICE=cpu for a dry run", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    if args.command == "single":
        run_single(args.out)
    elif args.command == "launched":
        run_launched(args.tag, args.out, args.deepspeed)
    else:
        print(json.dumps(summary(args.out, args.skipped)))
    return 0


def main(argv: list[str] | None = None) -> int:
    return cli(argv, __doc__.split("\n\n")[0], single, launched)


if __name__ == "__main__":
    sys.exit(main())
