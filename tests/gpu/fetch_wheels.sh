#!/usr/bin/env bash
# Wheels the GPU machine's image lacks (it has torch, accelerate, numpy, pandas, pyarrow, tokenizers, hf-hub, ...),
# for Python 3.12 on x86-64, into .gpu-wheels/ at the repository root (git-ignored; carry it to the GPU machine,
# e.g. the device tool's `carry: [".gpu-wheels"]`). About 25 MB.
# DeepSpeed ships only an sdist: its wheel is built here without compiled ops (they compile on first use there).
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .gpu-wheels
PY=${PYTHON:-python3}
PLATFORMS=(--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
$PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${PLATFORMS[@]}" \
  -d .gpu-wheels transformers==5.24.0 trl==1.16.0 peft==0.21.2 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 \
  hjson pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 liger-kernel==0.8.5
DS_BUILD_OPS=0 $PY -m pip wheel -q --no-deps --no-build-isolation -w .gpu-wheels deepspeed==0.19.8
# kinfolk itself as a wheel, so nothing is built on the GPU machine (its image's setuptools is not ours to rely on)
rm -rf build && $PY -m pip wheel -q --no-deps --no-build-isolation -w .gpu-wheels . && rm -rf build
du -sh .gpu-wheels
