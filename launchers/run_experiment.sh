#!/usr/bin/env bash
# Launch one paper experiment on the GPUs of this machine (or of the Ray cluster RAY_ADDRESS names).
#   launchers/run_experiment.sh <experiment> [flashreinforce|grpo] [more Hydra overrides...]
#   launchers/run_experiment.sh math_qwen2p5_1p5b flashreinforce dry_run=true
# Datasets: molt-flashreinforce-data <experiment> --out data   (data.dir=data is the default)
set -euo pipefail
experiment=${1:?usage: $0 <experiment> [flashreinforce|grpo] [overrides...]}
shift
algo=flashreinforce
if [[ $# -ge 1 && $1 != *=* ]]; then algo=$1; shift; fi
exec molt-flashreinforce experiment="$experiment" algo="$algo" "$@"
