"""Everything that spans machines, in one place that a GPU launch and a CPU rehearsal both go through.

* `slurm`: what the SLURM allocation says (nodes, this task's role, the head's address);
* `ray_nodes`: one Ray node per SLURM node (the head waits for the others, workers join and
  leave with it), with join timeouts, a version check and each node's logs kept in the run;
* `processes`: each node's task as a subreaper, so no process of the run outlives it;
* `actor_map`: which Ray node hosted which of Molt's actors (the run's `actors_by_node.json`);
* `supervisor`: the attempts of a run (restarts after crashes and stalls, a checkpoint and a
  requeue on SLURM's signals), `actor_watch` (a dead actor or node ends an attempt in seconds)
  and `stacks` (every process's Python stack when a run stalls);
* `progress`: the files through which Molt's workers report to the supervisor (written by
  plugin/progress.py).

Nothing here imports Molt or the rest of the package: the plugin, the launcher and the
rehearsal call in.
"""
