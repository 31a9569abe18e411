"""The cluster package's pieces on their own: the subreaper finds orphans, the actor map names
nodes by their SLURM name (or hostname), and the cluster settings are validated in one line."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from hydra import compose, initialize_config_module

from molt_flashreinforce.cluster.actor_map import group_actors, node_names
from molt_flashreinforce.cluster.ray_nodes import NODE_RESOURCE
from molt_flashreinforce.launch.errors import LaunchError
from molt_flashreinforce.launch.validate import validate


def test_an_orphaned_grandchild_is_found_and_stopped_by_the_subreaper():
    # A child starts a grandchild that ignores SIGTERM and SIGINT, then exits: the grandchild is re-parented to the
    # subreaper (not to init, where nothing would find it) and stop_descendants kills it.
    script = textwrap.dedent("""
        import os, subprocess, sys, time
        import psutil
        from molt_flashreinforce.cluster import processes
        processes.become_subreaper()
        middle = subprocess.Popen([sys.executable, "-c",
            "import signal, subprocess, sys; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "p = subprocess.Popen([sys.executable, '-c', 'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); signal.signal(signal.SIGINT, signal.SIG_IGN); time.sleep(300)']); "
            "print(p.pid, flush=True)"], stdout=subprocess.PIPE, text=True)
        orphan = int(middle.stdout.readline())
        middle.wait()
        time.sleep(0.5)
        assert psutil.Process(orphan).ppid() == os.getpid(), "not re-parented to the subreaper"
        killed = processes.stop_descendants(grace_s=1)
        assert not psutil.pid_exists(orphan) or psutil.Process(orphan).status() == psutil.STATUS_ZOMBIE
        print("killed", killed)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "killed ['python" in done.stdout  # it ignored both, so it needed SIGKILL


def test_actors_are_grouped_by_the_slurm_name_of_their_node():
    nodes = [{"NodeID": "a1", "NodeManagerHostname": "host", "Resources": {"CPU": 8.0, f"{NODE_RESOURCE}n2": 1.0}},
             {"NodeID": "b2", "NodeManagerHostname": "gpu07", "Resources": {"CPU": 8.0}}]
    names = node_names(nodes)
    assert names == {"a1": "n2", "b2": "gpu07"}  # a Ray that Molt started itself: the hostname
    actors = [{"ActorClassName": "PolicyModelActor", "Address": {"NodeID": "a1"}},
              {"ActorClassName": "PolicyModelActor", "Address": {"NodeID": "a1"}},
              {"ActorClassName": "RolloutRayActor", "Address": {"NodeID": "b2"}}]
    assert group_actors(actors, names) == {"gpu07": {"RolloutRayActor": 1}, "n2": {"PolicyModelActor": 2}}


@pytest.mark.parametrize("override, message", [
    ("cluster.ray_port=0", "cluster.ray_port=0 must be an integer >= 1"),
    ("cluster.ray_port=70000", "cluster.ray_port=70000 is not a TCP port"),
    ("cluster.join_timeout_s=-5", "cluster.join_timeout_s=-5 must be a positive number of seconds"),
    ("cluster.join_timeout_s=soon", "cluster.join_timeout_s=soon is not a number"),
])
def test_bad_cluster_settings_are_refused_in_one_line(override, message):
    with initialize_config_module(config_module="molt_flashreinforce.conf", version_base="1.3"):
        cfg = compose(config_name="config", overrides=["experiment=math_qwen2p5_1p5b", override])
    with pytest.raises(LaunchError, match=message.replace(".", r"\.")) as refused:
        validate(cfg)
    assert "\n" not in str(refused.value)


def test_a_head_that_fails_before_the_cluster_is_up_marks_it_stopped(tmp_path):
    import json

    from molt_flashreinforce.cluster.ray_nodes import HEAD_RECORD, cluster_dir, heading
    from molt_flashreinforce.cluster.slurm import Allocation

    head = Allocation(job_id="31", nodes=("n1", "n2"), this_node="n1", head_address="127.0.0.1")
    with pytest.raises(LaunchError):
        with heading(head, tmp_path):
            raise LaunchError("a bad value found while preparing the job")
    record = json.loads((cluster_dir(tmp_path, head) / HEAD_RECORD).read_text())
    assert record == {"job_id": "31", "node": "n1", "state": "stopped"}
    worker = Allocation(job_id="32", nodes=("n1", "n2"), this_node="n2", head_address="127.0.0.1")
    with heading(worker, tmp_path):  # a worker's failures are its own line, not the head's record
        pass
    assert not cluster_dir(tmp_path, worker).exists()
