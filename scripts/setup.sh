#!/usr/bin/env bash
# Create .venv (once) with the CPU build of torch, Molt's real code and this package.
# Idempotent: rerunning only installs what changed. Prints one line per step and its duration;
# pip's own output appears only for warnings and errors.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
PIP=(.venv/bin/python -m pip --disable-pip-version-check -q)
STEPS=6
started=$SECONDS

# pip reports molt-rl's GPU requirements as missing after every later install, as an `ERROR:` that
# is only a warning (the install succeeds): say so right under pip's lines.
explain_molt_requirements() {
  awk '
    /^molt-rl 0\.2\.1 requires / { listed = 1; print; next }
    listed { print_note(); listed = 0 }
    { print }
    END { if (listed) print_note() }
    function print_note() {
      print "      ^ expected on a CPU machine: molt-rl is installed with --no-deps, and the packages pip"
      print "        lists (vLLM, CUDA kernels, ...) exist only on GPU nodes. Nothing failed."
    }'
}

step() {  # step <number> <what> <command...>
  local number=$1 what=$2 begun=$SECONDS
  shift 2
  echo "[$number/$STEPS] $what ..."
  "$@" 2>&1 | explain_molt_requirements
  echo "      done in $((SECONDS - begun)) s"
}

if [ ! -x .venv/bin/python ]; then
  step 1 "creating .venv with $("$PYTHON" --version)" "$PYTHON" -m venv .venv
else
  echo "[1/$STEPS] .venv exists; reusing it"
fi
# Pinned first so that no later requirement can resolve torch to a CUDA wheel.
step 2 "torch 2.13.0, CPU build (about 200 MB)" "${PIP[@]}" install torch==2.13.0
step 3 "molt-rl 0.2.1 without its GPU dependencies" "${PIP[@]}" install --no-deps "molt-rl==0.2.1"
# NeMo AutoModel builds Molt's FSDP2 actor and checkpoints; its metadata pulls GPU kernels
# (megatron-fsdp, quack, flashoptim), so it comes without them, like molt-rl (the CPU rehearsal).
step 4 "NeMo AutoModel 0.7.0 and torchao without their GPU kernels (Molt's actor, for the CPU rehearsal)" \
  "${PIP[@]}" install --no-deps "nemo-automodel==0.7.0" "torchao==0.18.0"
step 5 "what Molt's CPU-importable modules need (requirements/cpu.txt: ray, transformers, ...)" \
  "${PIP[@]}" install -r requirements/cpu.txt
step 6 "molt-flashreinforce, editable, with its extras (ALFWorld builds its planner: the longest step)" \
  "${PIP[@]}" install -e ".[agents,alfworld,data,report,slurm,dev]"
echo "setup finished in $((SECONDS - started)) s; run: .venv/bin/molt-flashreinforce experiment=tiny"
