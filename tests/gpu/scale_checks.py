"""GPU checks of what the 2-process CPU tests show (issue 28): the option matrix, fit_atlas, distillation.

Run by `tests/gpu/run_gpu_checks.sh` after `gpu_checks.py`, with the same subcommands and output (one
OUT_DIR/<check>.json per check, gathered by `gpu_checks.py summary`):

    python scale_checks.py single OUT_DIR           the weighted-SFT options TRL cannot run on CPU, on one GPU
    python scale_checks.py launched TAG OUT_DIR     fit_atlas, LayerDistillationTrainer and the w ≡ 1 identity
              [--deepspeed CONFIG.json]             under the launcher's FSDP2 / ZeRO set-up

`single` runs tests/weighted_sft_options_helpers.py's identity-and-doubling check (w ≡ 1 equals SFTTrainer; w = 2 on
half the rows doubles their step) for `activation_offloading`, `use_liger_kernel` (when liger-kernel imports) and
`torch_compile` with the inductor backend, in fp32 with deterministic kernels. KINFOLK_GPU_CHECKS_DEVICE=cpu dry-runs
the plumbing with gradient checkpointing in their place.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import os
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]  # gpu_checks; the tests' option registry and helpers

from gpu_checks import (  # noqa: E402
    CPU_DRY_RUN,
    STEP1_TOLERANCE,
    check_losses,
    cli,
    common_args,
    guarded,
    model,
    retained_data,
    tokenizer,
    train_records,
    weighted_data,
)

GPU_OPTIONS = {
    "activation_offloading=True": {},
    "use_liger_kernel=True": {},
    "torch_compile=True": {"torch_compile_backend": "inductor"},
}


def _slug(name: str) -> str:
    return "".join(character if character.isalnum() else "_" for character in name.split("=")[0]).strip("_")


# ---- one GPU -------------------------------------------------------------------------------------------------


def single(out: Path) -> None:
    from weighted_sft_options_helpers import BY_NAME, assert_identity_and_doubling

    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=True)  # embedding backward's atomics would break rtol 1e-6
    tok = tokenizer()
    names = ["gradient_checkpointing=True"] if CPU_DRY_RUN else list(GPU_OPTIONS)
    for name in names:

        def part(figures, failures, name=name):
            if "liger" in name and importlib.util.find_spec("liger_kernel") is None:
                failures.append("liger-kernel is not installed (tests/gpu/fetch_wheels.sh can add its wheel)")
                return
            option = BY_NAME[name]
            options = {**option.options, **GPU_OPTIONS.get(name, {}), "use_cpu": CPU_DRY_RUN}
            assert_identity_and_doubling(
                tok, out / f"option-{_slug(name)}", dataclasses.replace(option, options=options)
            )
            figures["identity_and_doubling"] = "pass"

        guarded(out, f"option_{_slug(name)}", part)


# ---- under a distributed launcher ------------------------------------------------------------------------------


def _same_on_every_rank(tensors: list[torch.Tensor]) -> bool:
    """Whether every rank holds these exact tensors (their bytes' checksum, compared through all_gather)."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return True
    digest = torch.tensor(
        [float(t.detach().double().abs().sum()) + float((t.detach().double() ** 2).sum()) for t in tensors],
        dtype=torch.float64,
        device="cpu" if CPU_DRY_RUN else "cuda",
    )
    gathered = [torch.empty_like(digest) for _ in range(torch.distributed.get_world_size())]
    torch.distributed.all_gather(gathered, digest)
    return all(torch.equal(gathered[0], other) for other in gathered[1:])


def whole(module: torch.nn.Module):
    """The module's weights gathered where ZeRO-3 partitioned them (a comparison would see empty partitions)."""
    from kinfolk.sharding import zero3_partitioned

    if not zero3_partitioned(module):
        return contextlib.nullcontext()
    import deepspeed

    return deepspeed.zero.GatheredParameters(list(module.parameters()))


def launched(tag: str, out: Path, deepspeed: str | None) -> None:
    from accelerate import PartialState

    state = PartialState(cpu=CPU_DRY_RUN)  # the launcher's group, as the trainers' use_cpu will see it
    tok = tokenizer()
    teacher_dir, student_dir = out / f"{tag}-teacher", out / f"{tag}-student"
    # Written before any check's training arguments exist: a live ZeRO-3 config makes transformers build models
    # partitioned (zero.Init), and saving one of those writes empty tensors.
    with state.main_process_first():
        if state.is_main_process and not (student_dir / "config.json").is_file():
            from kinfolk.plugins.adapt import merge
            from kinfolk.testing import save_model

            save_model(model(tok), tok, teacher_dir)
            merge({"op": "init-student", "teacher": str(teacher_dir), "layers": {"every": 2, "last": 1}},
                  student_dir, progress=False)  # fmt: skip

    def fit_atlas_across_ranks(figures, failures):
        from peft import get_peft_model

        from kinfolk.plugins.atlas import AtlasConfig, AtlasLayer, fit_atlas

        base = model(tok, torch.bfloat16).to(state.device)
        peft_model = get_peft_model(base, AtlasConfig(r=16, num_regions=4, atlas_dtype="float32"))
        report = fit_atlas(peft_model, retained_data(), tok, batch_size=4, progress=False)
        figures.update(rank_rows=report.rank_rows, tokens=report.tokens, processes=state.num_processes)
        if len(report.rank_rows) != state.num_processes or sum(report.rank_rows) != len(retained_data()):
            failures.append(f"rows per rank {report.rank_rows} for {len(retained_data())} rows")
        atlas = [
            tensor
            for module in peft_model.modules()
            if isinstance(module, AtlasLayer)
            for name, tensor in module.named_buffers()
            if name.startswith("atlas_")
        ]
        if not atlas or not _same_on_every_rank(atlas):
            failures.append("the ranks hold different atlases")

    def weighted_identity(figures, failures):
        """w ≡ 1 gives SFTTrainer's losses under the launcher (bf16: within the launched step-1 tolerance)."""
        from trl import SFTConfig, SFTTrainer

        from kinfolk.trainers import WeightedSFTConfig, WeightedSFTTrainer

        data = weighted_data(64)
        ones = data.remove_columns("weight").add_column("weight", [1.0] * len(data))
        options = common_args(out / f"{tag}-identity", deepspeed=deepspeed, bf16=True, max_steps=4)
        ours = WeightedSFTTrainer(
            model=model(tok), args=WeightedSFTConfig(**options), train_dataset=ones, processing_class=tok
        )
        ours.train()
        theirs = SFTTrainer(
            model=model(tok),
            args=SFTConfig(**options),
            train_dataset=data.remove_columns("weight"),
            processing_class=tok,
        )
        theirs.train()
        mine, reference = ([entry["loss"] for entry in train_records(t)] for t in (ours, theirs))
        figures.update(weighted=mine, sft=reference, distributed_type=str(ours.accelerator.distributed_type))
        worst = max(abs(a - b) / abs(b) for a, b in zip(mine, reference))
        figures["max_relative_difference"] = worst
        if len(mine) != len(reference) or worst > STEP1_TOLERANCE["launched"]:
            failures.append(f"weighted (w = 1) losses {mine} differ from SFTTrainer's {reference}")

    def distillation(figures, failures):
        """The teacher stays frozen; under ZeRO-3 the KL term is refused and the cosine term trains alone."""
        from kinfolk.testing import prompt_completion_dataset, text_dataset
        from kinfolk.trainers import LayerDistillationConfig, LayerDistillationTrainer

        def distillation_trainer(kl_weight: float):
            args = LayerDistillationConfig(**common_args(out / f"{tag}-distil", deepspeed=deepspeed, bf16=True,
                                                         kl_weight=kl_weight))  # fmt: skip
            return LayerDistillationTrainer(
                model=str(student_dir),
                teacher_model=str(teacher_dir),
                args=args,
                train_dataset=prompt_completion_dataset(256),
                pretraining_dataset=text_dataset(256, seed=1),
                processing_class=tok,
            )

        kl_weight = 0.2
        if tag == "zero3":
            try:
                distillation_trainer(kl_weight)
                failures.append("kl_weight > 0 was accepted under ZeRO-3")
            except ValueError as error:
                figures["kl_refusal"] = str(error)
            kl_weight = 0.0
        trainer = distillation_trainer(kl_weight)
        # The DeepSpeed engine wraps the teacher; its eval() sets the wrapped module's mode, not the engine's own.
        teacher = getattr(trainer.teacher_model, "module", trainer.teacher_model)
        with whole(teacher):
            before = [p.detach().clone() for p in teacher.parameters()]
        trainer.train()
        figures["loss"] = check_losses(train_records(trainer), failures, f"{tag} distil")
        figures["teacher_type"] = type(trainer.teacher_model).__name__
        figures["distributed_type"] = str(trainer.accelerator.distributed_type)
        if teacher.training or any(p.requires_grad for p in teacher.parameters()):
            failures.append("the teacher is trainable or in training mode")
        with whole(teacher):
            if any(not torch.equal(a, b.detach()) for a, b in zip(before, teacher.parameters())):
                failures.append("the teacher's weights changed during training")
        logged = "distill/kl" if kl_weight else "distill/cosine_distance"
        if not all(logged in entry and entry[logged] >= 0 for entry in train_records(trainer)):
            failures.append(f"a step logged no (or a negative) {logged}")

    def output_kl(figures, failures):
        """Output-KL trains under DDP and ZeRO-2; FSDP2 and ZeRO-3 refuse it at construction."""
        from peft import LoraConfig

        from kinfolk.trainers import WeightedSFTConfig, WeightedSFTTrainer

        options = common_args(out / f"{tag}-output-kl", deepspeed=deepspeed, bf16=True, output_kl_coef=1.0)
        try:
            trainer = WeightedSFTTrainer(
                model=model(tok),
                args=WeightedSFTConfig(**options, output_kl_batch_size=4),
                train_dataset=weighted_data(64),
                processing_class=tok,
                peft_config=LoraConfig(r=8, target_modules=["q_proj", "v_proj"]),
                retained_dataset=retained_data(),
            )
        except ValueError as error:
            figures["refusal"] = str(error)
            if tag not in ("fsdp2", "zero3"):
                failures.append(f"refused under {tag}: {error}")
            return
        if tag in ("fsdp2", "zero3"):
            failures.append(f"output_kl_coef > 0 was accepted under {tag}")
        trainer.train()
        figures["loss"] = check_losses(train_records(trainer), failures, f"{tag} output-kl")
        figures["output_kl"] = [entry.get("output_kl") for entry in train_records(trainer)]
        if not all(value is not None and value >= -1e-6 for value in figures["output_kl"]):
            failures.append(f"a step logged no (or a negative) output_kl: {figures['output_kl']}")

    guarded(out, f"{tag}_fit_atlas", fit_atlas_across_ranks)
    guarded(out, f"{tag}_output_kl", output_kl)
    guarded(out, f"{tag}_weighted_identity", weighted_identity)
    guarded(out, f"{tag}_distillation", distillation)


def main(argv: list[str] | None = None) -> int:
    return cli(argv, __doc__.split("\n\n")[0], single, launched)


if __name__ == "__main__":
    sys.exit(main())
