"""Roles in a multi-node SLURM allocation (the `molt_slurm` launcher runs the job once per node),
and the SLURM launcher preset sized from the placement. No SLURM or Ray cluster is started here:
`scontrol` is replaced by a resolver that expands the node list the way SLURM would."""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_module

from molt_flashreinforce.launch.ray_cluster import RAY_PORT, slurm_role


def first_of(nodelist: str) -> str:
    assert nodelist == "gpu[03-04]"
    return "gpu03"


def allocation(procid: str, nodes: int = 2, ntasks: int | None = None) -> dict[str, str]:
    return {"SLURM_PROCID": procid, "SLURM_JOB_NUM_NODES": str(nodes), "SLURM_NTASKS": str(ntasks or nodes),
            "SLURM_JOB_NODELIST": "gpu[03-04]"}


def test_outside_slurm_or_on_one_node_molt_starts_its_own_ray():
    assert slurm_role({}, first_of) is None
    assert slurm_role(allocation("0", nodes=1), first_of) is None


def test_task_zero_is_the_head_and_the_others_join_it():
    head = slurm_role(allocation("0"), first_of)
    worker = slurm_role(allocation("1"), first_of)
    assert head.is_head and not worker.is_head
    assert head.address == worker.address == f"gpu03:{RAY_PORT}"
    assert head.nodes == 2


def test_more_than_one_task_per_node_is_refused():
    with pytest.raises(RuntimeError, match="hydra.launcher.tasks_per_node=1"):
        slurm_role(allocation("0", ntasks=16), first_of)


def test_slurm_preset_takes_nodes_and_gpus_from_the_placement():
    with initialize_config_module(config_module="molt_flashreinforce.conf", version_base="1.3"):
        cfg = compose(config_name="config", overrides=["experiment=moe_lag8_qwen3_30b_a3b",
                                                       "hydra/launcher=molt_slurm"], return_hydra_config=True)
    launcher = cfg.hydra.launcher
    assert (launcher.nodes, launcher.gpus_per_node, launcher.tasks_per_node) == (4, 8, 1)
    assert launcher._target_ == "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher"
