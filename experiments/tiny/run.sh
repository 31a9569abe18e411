#!/usr/bin/env bash
# The tiny comparison (docs/local.md): FlashREINFORCE (1 rollout per prompt) vs GRPO (G=4) at equal
# rollout budgets (128 trajectories per update, 300 updates), at policy lag 0 and 8, plus
# FlashREINFORCE without its trust region (delta=inf) at lag 8; seeds 0, 1, 2. Every job is the
# main command's configuration (conf/experiment/tiny.yaml) with only these overrides.
# Run from the repository root; jobs run one after another (Hydra's basic launcher).
set -euo pipefail
out=${1:-runs/tiny_comparison}
molt-flashreinforce -m experiment=tiny algo=flashreinforce,grpo local.policy_lag=0,8 seed=0,1,2 \
  local.progress_bar=false hydra.sweep.dir="$out/main"
molt-flashreinforce -m experiment=tiny algo=flashreinforce algo.delta=inf local.policy_lag=8 seed=0,1,2 \
  local.progress_bar=false hydra.sweep.dir="$out/delta_inf"
python experiments/tiny/summarize.py "$out" --out experiments/tiny
# The README's report example: seed 0 at lag 0, FlashREINFORCE beside GRPO.
molt-flashreinforce-report "$out"/main/*_algo=flashreinforce,local.policy_lag=0,*seed=0 \
  "$out"/main/*_algo=grpo,local.policy_lag=0,*seed=0 > experiments/tiny/report_lag0_seed0.md
