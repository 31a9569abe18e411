#!/usr/bin/env bash
# A SLURM cluster of several nodes on this one host, to rehearse the multi-node path (sbatch,
# srun, the molt_slurm launcher, the Ray head and workers) on a laptop, a login node or in CI:
#
#   eval "$(bash scripts/local_slurm.sh up <dir> [nodes=4] [cpus_per_node=4])"   # exports SLURM_CONF
#   sbatch --nodes=2 --gpus-per-node=0 --cpus-per-task=1 launchers/slurm_job.sbatch math_qwen2p5_1p5b flashreinforce rehearsal=cpu
#   bash scripts/local_slurm.sh down <dir>
#
# It runs a private munged, one slurmctld and one slurmd per node (n1, n2, ...), all on this host:
# each node has its own NodeName, Port, spool, pid and log files, NodeHostname this host and
# NodeAddr 127.0.0.1. What differs from a real cluster (docs/launch.md, "Multi-node runs"): every
# node shares this host's CPUs, memory, /tmp and network; processes are tracked by parentage
# (proctrack/linuxproc), not cgroups; there are no GRES GPUs, no accounting and no prolog/epilog.
# Needs Debian's slurm-wlm and munge (scripts/setup_slurm.sh) and root (slurmd starts jobs as
# their user). `up` waits until every node is idle and prints `export SLURM_CONF=...`.
set -euo pipefail
PATH="$PATH:/usr/sbin"
command=${1:?usage: $0 up|down <dir> [nodes] [cpus_per_node]}
dir=${2:?usage: $0 up|down <dir> [nodes] [cpus_per_node]}

down() {
  for pid_file in "$dir"/slurmd-*.pid "$dir"/slurmctld.pid "$dir"/munged.pid; do
    [ -f "$pid_file" ] || continue
    pid=$(cat "$pid_file")
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    kill -9 "$pid" 2>/dev/null || true
    rm -f "$pid_file"
  done
}

if [ "$command" = down ]; then down; exit 0; fi
[ "$command" = up ] || { echo "usage: $0 up|down <dir> [nodes] [cpus_per_node]" >&2; exit 2; }
nodes=${3:-4}
cpus=${4:-4}
for program in munged slurmctld slurmd sinfo; do
  command -v "$program" >/dev/null || { echo "$program is missing: bash scripts/setup_slurm.sh installs SLURM and munge" >&2; exit 1; }
done
[ "$(id -u)" -eq 0 ] || { echo "slurmd must run as root (it starts jobs as their user)" >&2; exit 1; }

mkdir -p "$dir/state" "$dir/spool"
chmod 755 "$dir"  # munged checks that its socket's directory is reachable
dir=$(cd "$dir" && pwd)
host=$(hostname -s)
# Free TCP ports for slurmctld and every slurmd, picked by the kernel.
read -r -a ports <<<"$(python3 -c "
import socket
held = [socket.socket() for _ in range($nodes + 1)]
for s in held: s.bind(('127.0.0.1', 0))
print(' '.join(str(s.getsockname()[1]) for s in held))")"
head -c 1024 /dev/urandom >"$dir/munge.key"
chmod 400 "$dir/munge.key"
{
  cat <<CONF
ClusterName=local
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$dir/munge.sock
CredType=cred/munge
SlurmctldPort=${ports[0]}
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd-%n.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
# Declared CPUs, whatever this host has: every node shares the same cores.
SlurmdParameters=config_overrides
CONF
  for i in $(seq "$nodes"); do
    echo "NodeName=n$i NodeHostname=$host NodeAddr=127.0.0.1 Port=${ports[$i]} CPUs=$cpus State=UNKNOWN"
  done
  echo "PartitionName=local Nodes=ALL Default=YES MaxTime=60 State=UP"
} >"$dir/slurm.conf"
export SLURM_CONF="$dir/slurm.conf"

munged --force --socket="$dir/munge.sock" --key-file="$dir/munge.key" --log-file="$dir/munged.log" \
  --pid-file="$dir/munged.pid" --seed-file="$dir/munged.seed"
slurmctld -i
for _ in $(seq 50); do scontrol ping >/dev/null 2>&1 && break; sleep 0.2; done
for i in $(seq "$nodes"); do
  mkdir -p "$dir/spool/n$i"
  slurmd -N "n$i"
done
for _ in $(seq 120); do
  idle=$(sinfo -h -N -t idle -o %N 2>/dev/null | sort -u | wc -l)
  [ "$idle" -eq "$nodes" ] && { echo "export SLURM_CONF=$SLURM_CONF"; exit 0; }
  sleep 0.5
done
echo "the local SLURM cluster did not become idle: sinfo says" >&2
sinfo -N >&2 || true
tail -n 20 "$dir"/*.log >&2 || true
down
exit 1
