"""SLURM for real: the local cluster of `conftest.slurm` (scripts/local_slurm.sh: munged, slurmctld and
four slurmd on this host) runs what users run, a Hydra multirun of tiny CPU jobs through
`hydra/launcher=molt_slurm` with one job failing on purpose, and `launchers/slurm_job.sbatch` in
one-node mode. Also the roles of a multi-node allocation, with SLURM's own `scontrol` expanding the
node list and giving the head's address, and the launcher preset sized from the placement.
Multi-node runs are in test_cluster_nodes.py and test_rehearsal_runs.py."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from hydra import compose, initialize_config_module

from molt_flashreinforce.cluster.slurm import allocation, hostnames, node_address

REPO = Path(__file__).resolve().parents[1]
# Each job is a few seconds of training; the budget is Python and torch start-up.
TINY = ["experiment=tiny", "local.steps=2", "local.warm_start.steps=2", "local.eval.every=1", "local.task.eval_size=16",
        "local.rollouts_per_step=8", "local.progress_bar=false"]
JOB_TIMEOUT_S = 240


def wait_for(job_id: str, env: dict[str, str], timeout_s: float = JOB_TIMEOUT_S) -> str:
    """The job's final state, polled through scontrol (sbatch --wait polls once per 32 s at most)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        shown = subprocess.run(["scontrol", "show", "job", job_id, "-o"], env=env, capture_output=True, text=True).stdout
        state = next((f.partition("=")[2] for f in shown.split() if f.startswith("JobState=")), "")
        if state not in ("", "PENDING", "RUNNING", "CONFIGURING", "COMPLETING"):
            return state
        time.sleep(0.5)
    raise AssertionError(f"SLURM job {job_id} did not finish in {timeout_s} s")


def cluster_state(env: dict[str, str], sweep: Path) -> str:
    """What SLURM and the sweep's jobs say, for a sweep that did not end."""
    shown = [subprocess.run(command, env=env, capture_output=True, text=True, timeout=30).stdout
             for command in (["sinfo", "-N", "-o", "%N %T %C %E"], ["squeue", "-o", "%i %T %r %N %M"])]
    logs = "".join(f"\n--- {log.relative_to(sweep)}:\n{log.read_text()[-1500:]}" for log in sorted(sweep.glob(".submitit/*/*_log.*")))
    return f"nodes:\n{shown[0]}jobs:\n{shown[1]}{logs}"


@pytest.mark.slow
def test_multirun_through_the_molt_slurm_launcher_survives_a_failing_job(slurm, tmp_path):
    sweep = tmp_path / "sweep"
    try:
        done = subprocess.run(
            [sys.executable, "-m", "molt_flashreinforce", "-m", "hydra/launcher=molt_slurm", "hydra.launcher.partition=local",
             # the tiny experiment needs no GPU and one CPU
             "hydra.launcher.gpus_per_node=null", "hydra.launcher.cpus_per_task=1", "hydra.launcher.timeout_min=10",
                 # SLURM's time-limit warning within the 10 minutes (the default lead, 900 s, is refused)
                 "hydra.launcher.signal_delay_s=60",
             *TINY, "local.policy_lag=0,1,-1", f"hydra.sweep.dir={sweep}"],
            cwd=tmp_path, env=slurm, capture_output=True, text=True, timeout=JOB_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the sweep did not end in {JOB_TIMEOUT_S} s; {cluster_state(slurm, sweep)}") from None
    assert done.returncode != 0  # the sweep reports its failed job at the end
    refusal = "molt-flashreinforce: error: local.policy_lag=-1 must be an integer >= 0"
    assert refusal in done.stderr and "Traceback" not in done.stderr, done.stderr[-3000:]
    jobs = sorted((d for d in sweep.iterdir() if d.is_dir() and d.name[0].isdigit()), key=lambda d: int(d.name.split("_")[0]))
    assert [d.name.split("_")[0] for d in jobs] == ["0", "1", "2"]
    for job in jobs[:2]:  # the good jobs ran to the end, whatever the failing one did
        assert (job / "summary.json").is_file() and (job / "checkpoints" / "step_000002.pt").is_file()
        assert list((job / "tensorboard").glob("events.out.tfevents.*"))
    assert f"refused: {refusal.removeprefix('molt-flashreinforce: error: ')}" in (jobs[2] / "app.log").read_text()
    assert not (jobs[2] / "launch").exists()
    # SLURM's own output of each job is where docs/launch.md says: <sweep>/.submitit/<array id>_<job num>/
    logs = {log.parent.name.rpartition("_")[2]: log for log in sweep.glob(".submitit/*_*/*_log.err")}
    assert sorted(logs) == ["0", "1", "2"]
    assert refusal in logs["2"].read_text()
    assert "Warm start: 2 supervised steps" in logs["0"].with_name(logs["0"].name.replace(".err", ".out")).read_text()


@pytest.mark.slow
def test_plain_sbatch_script_runs_one_node_and_writes_where_its_header_says(slurm, tmp_path):
    # One node, no GPU, one CPU: command-line options override the script's #SBATCH lines, the time
    # limit's warning too (the script's USR2@900 would come at once within --time=10, while Python
    # still imports, before any handler exists).
    submitted = subprocess.run(
        ["sbatch", "--parsable", "--nodes=1", "--gpus-per-node=0", "--cpus-per-task=1", "--time=10",
         "--signal=USR2@60",
         str(REPO / "launchers" / "slurm_job.sbatch"), "tiny", "grpo", *TINY[1:]],
        cwd=tmp_path, env=slurm, capture_output=True, text=True, timeout=60,
    )
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip().split(";")[0]
    assert wait_for(job_id, slurm) == "COMPLETED", (tmp_path / f"slurm-{job_id}.out").read_text()[-3000:]
    run_dir = tmp_path / "runs" / "tiny" / "grpo" / f"slurm-{job_id}"  # the script's default RUN_DIR
    assert (run_dir / "summary.json").is_file() and (run_dir / "launch" / "config.yaml").is_file()
    output = (tmp_path / f"slurm-{job_id}.out").read_text()  # #SBATCH --output=slurm-%j.out
    assert "tiny: grpo lag=0 seed=0 | eval pass@1" in output


@pytest.fixture
def scontrol(slurm, monkeypatch):
    """SLURM's own scontrol for the code under test (it needs a cluster's slurm.conf even to expand names)."""
    for name in ("SLURM_CONF", "PATH"):
        monkeypatch.setenv(name, slurm[name])


def test_scontrol_expands_the_node_list_and_gives_the_first_nodes_address(scontrol):
    assert hostnames("gpu[03-04]") == ["gpu03", "gpu04"]
    assert hostnames("a[09-10],b01") == ["a09", "a10", "b01"]
    assert node_address("n1") == "127.0.0.1"  # scripts/local_slurm.sh: NodeAddr=127.0.0.1
    assert node_address("not-a-node") == "not-a-node"


def task(procid: str, nodes: int = 2, ntasks: int | None = None) -> dict[str, str]:
    return {"SLURM_PROCID": procid, "SLURM_NODEID": procid, "SLURM_JOB_NUM_NODES": str(nodes),
            "SLURM_NTASKS": str(ntasks or nodes), "SLURM_JOB_NODELIST": "gpu[03-04]", "SLURM_JOB_ID": "7"}


def test_outside_slurm_or_on_one_node_molt_starts_its_own_ray():
    assert allocation({}) is None
    assert allocation(task("0", nodes=1)) is None


def test_the_first_node_leads_and_the_others_join_its_address(scontrol):
    head = allocation(task("0"), address_of=lambda name: f"addr-of-{name}")
    worker = allocation({**task("1"), "SLURMD_NODENAME": "gpu04"}, address_of=lambda name: f"addr-of-{name}")
    assert head.is_head and not worker.is_head
    assert head.nodes == worker.nodes == ("gpu03", "gpu04")
    assert (head.this_node, worker.this_node) == ("gpu03", "gpu04")
    assert head.head_address == worker.head_address == "addr-of-gpu03"
    assert head.job_id == "7"


def test_more_than_one_task_per_node_is_refused():
    with pytest.raises(RuntimeError, match="hydra.launcher.tasks_per_node=1"):
        allocation(task("0", ntasks=16))


def test_slurm_preset_takes_nodes_and_gpus_from_the_placement():
    with initialize_config_module(config_module="molt_flashreinforce.conf", version_base="1.3"):
        cfg = compose(config_name="config", overrides=["experiment=moe_lag8_qwen3_30b_a3b",
                                                       "hydra/launcher=molt_slurm"], return_hydra_config=True)
    launcher = cfg.hydra.launcher
    assert (launcher.nodes, launcher.gpus_per_node, launcher.tasks_per_node) == (4, 8, 1)
    assert launcher._target_ == "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher"
