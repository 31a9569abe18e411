#!/usr/bin/env bash
# Create .venv (once) with the CPU build of torch, Molt's real code and this package.
# Idempotent: rerunning only installs what changed.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
PIP=(.venv/bin/python -m pip --disable-pip-version-check -q)
# Pinned first so that no later requirement can resolve torch to a CUDA wheel.
"${PIP[@]}" install torch==2.13.0
"${PIP[@]}" install --no-deps "molt-rl==0.2.1"
# NeMo AutoModel builds Molt's FSDP2 actor and checkpoints; its metadata pulls GPU kernels
# (megatron-fsdp, quack, flashoptim), so it comes without them, like molt-rl (the CPU rehearsal).
"${PIP[@]}" install --no-deps "nemo-automodel==0.7.0" "torchao==0.18.0"
"${PIP[@]}" install -r requirements/cpu.txt
"${PIP[@]}" install -e ".[agents,alfworld,data,report,slurm,dev]"
