#!/usr/bin/env bash
# Install Debian's SLURM (slurm-wlm, 22.05 on Debian 12) and munge for the tests that start a
# one-node cluster on localhost (tests/test_launch_slurm.py). Idempotent; skipped, with the reason,
# when they are already installed, when not running as root, or without apt-get. Nothing is
# configured or started here: the tests run their own private munged, slurmctld and slurmd.
set -euo pipefail
needed=(slurmctld slurmd munged sbatch)
missing=()
for program in "${needed[@]}"; do
  PATH="$PATH:/usr/sbin" command -v "$program" >/dev/null || missing+=("$program")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "SLURM and munge are installed; the SLURM tests will run"
  exit 0
fi
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
  echo "SLURM is not installed (${missing[*]} missing) and this is not root with apt-get: the SLURM tests will be skipped"
  exit 0
fi
echo "installing slurm-wlm and munge with apt-get (about a minute), for the SLURM tests ..."
begun=$SECONDS
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge >/dev/null
echo "      done in $((SECONDS - begun)) s"
