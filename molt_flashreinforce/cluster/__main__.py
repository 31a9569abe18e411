"""`srun python -m molt_flashreinforce.cluster [--run-dir DIR]`: form the Ray cluster of this SLURM
allocation exactly as a multi-node launch does (`ray_nodes`), run one Ray task on every node,
print where each ran, and tear everything down. Run it on a new cluster, or on a laptop with
`scripts/local_slurm.sh`, before spending GPU hours: a node that cannot join, a head out of reach
or mismatched versions fail here in one line, in seconds.

    srun --nodes=2 --ntasks-per-node=1 python -m molt_flashreinforce.cluster --run-dir runs/cluster-check
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from molt_flashreinforce.cluster import ray_nodes, slurm
from molt_flashreinforce.cluster.errors import ClusterError

_EVERY_NODE = """
import socket, ray
ray.init(log_to_driver=False, logging_level="ERROR")
prefix = {prefix!r}
names = sorted(key[len(prefix):] for node in ray.nodes() if node["Alive"] for key in node["Resources"] if key.startswith(prefix))
where = ray.remote(lambda: socket.gethostname())
hosts = ray.get([where.options(num_cpus=0, resources={{prefix + name: 0.001}}).remote() for name in names])
for name, host in zip(names, hosts):
    print(f"  {{name}}: a Ray task ran there (host {{host}})")
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m molt_flashreinforce.cluster", description=__doc__.split("\n\n")[0])
    parser.add_argument("--run-dir", type=Path, default=Path("runs/cluster-check"), help="where each node keeps its logs")
    parser.add_argument("--ray-port", type=int, default=ray_nodes.ClusterSettings.ray_port)
    parser.add_argument("--join-timeout-s", type=float, default=ray_nodes.ClusterSettings.join_timeout_s)
    args = parser.parse_args(argv)
    allocation = slurm.allocation(os.environ)
    if allocation is None:
        print("not a multi-node SLURM allocation: run it with srun --nodes=N --ntasks-per-node=1 (N >= 2)", file=sys.stderr)
        return 2
    settings = ray_nodes.ClusterSettings(ray_port=args.ray_port, join_timeout_s=args.join_timeout_s)

    def every_node(env: dict[str, str]) -> None:
        script = _EVERY_NODE.format(prefix=ray_nodes.NODE_RESOURCE)
        subprocess.run([sys.executable, "-c", script], env={**os.environ, **env}, check=True)

    try:
        if allocation.is_head:
            ray_nodes.lead(allocation, settings, ray_nodes.NodeResources(), args.run_dir, every_node)
            print(f"cluster check passed: {len(allocation.nodes)} nodes; logs in "
                  f"{ray_nodes.cluster_dir(args.run_dir, allocation)}", flush=True)
        else:
            ray_nodes.join(allocation, settings, ray_nodes.NodeResources(), args.run_dir)
    except ClusterError as error:
        print(f"molt-flashreinforce: error: {error}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
