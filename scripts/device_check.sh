#!/usr/bin/env bash
# The device check in one command, from any directory (see scripts/device_check.py):
#
#   bash scripts/device_check.sh                      # CUDA: under 8 minutes on one H200
#   bash scripts/device_check.sh --wheels wheels/     # first install these wheels (--no-deps, offline)
#   bash scripts/device_check.sh --device cpu         # the same comparisons at CI sizes
#
# Needs python with torch; nothing is downloaded. Writes experiments/device/<device>.json and
# prints one verdict line; exit status 0 = PASS, 1 = FAIL, 124 = it ran past its time limit.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${PYTHON:-python3}"
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"
# 470 s leaves the 8-minute budget a margin for Python's start-up and the file copy back.
exec timeout "${DEVICE_CHECK_TIMEOUT_S:-470}" "$python" "$repo/scripts/device_check.py" "$@"
