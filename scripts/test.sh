#!/usr/bin/env bash
# Set up (scripts/setup.sh, vLLM's CPU build for the real-engine tests, and SLURM for its tests
# where root and apt-get exist) and run the whole test suite on the CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/setup_vllm.sh
bash scripts/setup_slurm.sh
set +e
.venv/bin/python -m pytest "$@"
status=$?
set -e
# pytest exits 5 when nothing was collected: that is a broken suite, not a pass.
if [ "$status" -eq 5 ]; then echo "no tests were collected" >&2; exit 1; fi
exit "$status"
