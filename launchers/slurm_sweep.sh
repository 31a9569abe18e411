#!/usr/bin/env bash
# A Hydra multirun on SLURM: one allocation per job, sized from the experiment's placement
# (hydra/launcher=molt_slurm). Run it on a login node; it submits and waits.
#   launchers/slurm_sweep.sh <partition> [account]
# Each job writes runs/multirun/<experiment>/<time>/<n>_<overrides>/; resubmitting a job with
# hydra.run.dir=<that dir> resumes it from its latest checkpoint.
set -euo pipefail
partition=${1:?usage: $0 <partition> [account]}
account=${2:-null}
exec molt-flashreinforce -m \
  hydra/launcher=molt_slurm \
  hydra.launcher.partition="$partition" \
  hydra.launcher.account="$account" \
  experiment=math_qwen2p5_1p5b \
  algo=flashreinforce \
  algo.delta=1e-3,3e-3,5e-3
