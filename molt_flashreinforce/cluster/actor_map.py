"""Where the run's actors ran: node -> actor class -> count, read from Ray's GCS while it is up.

`write(path)` is called by Molt's driver process right after `train(args)` returns, so that the
actors, dead or alive, are still in the GCS's actor table; only this driver's job's actors count
(on a multi-node allocation the Ray cluster outlives an attempt, and its table keeps the actors of
the attempts before). A node is named by its
`molt_flashreinforce_node:<name>` resource (set by `ray_nodes` on a SLURM allocation) or,
on a Ray that Molt started itself, by its hostname.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from molt_flashreinforce.cluster.ray_nodes import NODE_RESOURCE


def node_names(nodes: list[dict]) -> dict[str, str]:
    """Ray node id -> node name."""
    names = {}
    for node in nodes:
        named = [key[len(NODE_RESOURCE):] for key in node["Resources"] if key.startswith(NODE_RESOURCE)]
        names[node["NodeID"]] = named[0] if named else node["NodeManagerHostname"]
    return names


def group_actors(actors: list[dict], names: dict[str, str]) -> dict[str, dict[str, int]]:
    by_node: dict[str, Counter] = {}
    for actor in actors:
        node = names.get(actor["Address"]["NodeID"], actor["Address"]["NodeID"])
        by_node.setdefault(node, Counter())[actor["ActorClassName"]] += 1
    return {node: dict(sorted(counts.items())) for node, counts in sorted(by_node.items())}


def actors_by_node() -> dict[str, dict[str, int]]:
    import ray
    import ray._private.state as gcs_state  # the GCS actor table; ray.util.state needs the dashboard

    job_id = ray.get_runtime_context().get_job_id()
    actors = [actor for actor in gcs_state.actors().values() if actor.get("JobID") == job_id]
    return group_actors(actors, node_names(ray.nodes()))


def write(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(actors_by_node(), indent=1))


def read(path: Path) -> dict[str, dict[str, int]] | None:
    return json.loads(path.read_text()) if path.is_file() else None
