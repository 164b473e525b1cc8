#!/usr/bin/env bash
# kinfolk's GPU checks in one run: bf16 weighted SFT and ATLAS on one GPU, then the training parts under FSDP2
# (`accelerate launch --config_file tests/gpu/fsdp2.yaml`) and DeepSpeed ZeRO-2 / ZeRO-3 (tests/gpu/zero*.json).
# tests/gpu/scale_checks.py adds, at each stage, what the 2-process CPU tests show: the weighted-SFT options TRL
# cannot run on CPU (activation offloading, liger, inductor), and fit_atlas, LayerDistillationTrainer and the w = 1
# identity with SFTTrainer under each launcher.
# About 8 minutes on one H200 (478 s on 2026-12-04); ends with one JSON line (also in OUT_DIR/summary.json). CI never runs it.
#
#   bash tests/gpu/run_gpu_checks.sh [OUT_DIR]                      from any directory; default runs/gpu-checks
#
# A machine without network (like the project's lent GPU machines) needs the packages its image lacks as wheels:
# run `bash tests/gpu/fetch_wheels.sh` where pip works; it fills .gpu-wheels/ (git-ignored), which this script
# installs first. DeepSpeed is skipped, with a note in the summary, when it cannot be imported.
# KINFOLK_GPU_CHECKS_DEVICE=cpu: a dry run of these scripts on CPU at a tiny size, with 2-process DDP in place of
# FSDP2 and ZeRO (checks the scripts, not the GPU). KINFOLK_GPU_CHECKS_STAGES="zero3 zero2" runs those stages only
# (default: single fsdp2 zero2 zero3). OUT_DIR/records.json holds every check's record, figures included.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-runs/gpu-checks}
PY=${PYTHON:-python3}
SITE=/tmp/kinfolk-gpu-site
mkdir -p "$OUT"
if ! $PY -c "import trl" 2>/dev/null && compgen -G ".gpu-wheels/*.whl" >/dev/null; then  # the image lacks the stack
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .gpu-wheels/*.whl || exit 1
  export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
fi
if ! (cd /tmp && $PY -c "import kinfolk.trainers" 2>/dev/null); then  # kinfolk itself: this checkout, no deps
  $PY -m pip install -q --no-deps --no-build-isolation --upgrade --target "$SITE" . || exit 1  # --upgrade: never a stale copy
  export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
fi
export TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 PYTHONUNBUFFERED=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}
$PY -c "import torch, transformers, trl, peft, accelerate; print('stack:', *(f'{m.__name__} {m.__version__}' for m in (torch, transformers, trl, peft, accelerate)), 'cuda', torch.cuda.is_available())"
CHECKS="tests/gpu/gpu_checks.py"
SCALE="tests/gpu/scale_checks.py"
skipped=()
STAGES=${KINFOLK_GPU_CHECKS_STAGES:-single fsdp2 zero2 zero3}  # a subset reruns what a short device lease allows
for stage in $STAGES; do
  case $stage in
    single)
      $PY $CHECKS single "$OUT"
      $PY $SCALE single "$OUT" ;;
    fsdp2)
      for script in $CHECKS $SCALE; do
        if [ "${KINFOLK_GPU_CHECKS_DEVICE:-}" = cpu ]; then  # the dry run: 2-process DDP in place of FSDP2 and ZeRO
          $PY -m accelerate.commands.launch --multi_gpu --num_processes 2 --main_process_port 0 $script launched ddp "$OUT"
        else
          $PY -m accelerate.commands.launch --config_file tests/gpu/fsdp2.yaml $script launched fsdp2 "$OUT"
        fi
      done ;;
    zero2 | zero3)
      if [ "${KINFOLK_GPU_CHECKS_DEVICE:-}" = cpu ]; then
        continue
      elif ! $PY -c "import deepspeed" 2>/dev/null; then
        echo "DeepSpeed $stage skipped: deepspeed cannot be imported (tests/gpu/fetch_wheels.sh builds its wheel)" >&2
        skipped+=(--skipped "$stage: deepspeed cannot be imported")
        continue
      fi
      for script in $CHECKS $SCALE; do
        $PY -m torch.distributed.run --standalone --nproc_per_node 1 $script launched "$stage" "$OUT" \
          --deepspeed "tests/gpu/$stage.json"
      done ;;
    *) echo "unknown stage $stage (single, fsdp2, zero2, zero3)" >&2; exit 2 ;;
  esac
done
$PY $CHECKS summary "$OUT" "${skipped[@]}" | tee "$OUT/summary.json"
