"""SLURM for real: a one-node cluster on localhost (a private munged, slurmctld and slurmd, started
by the fixture below) runs what users run, a Hydra multirun of tiny CPU jobs through
`hydra/launcher=molt_slurm` with one job failing on purpose, and `launchers/slurm_job.sbatch` in
one-node mode. Also the head/worker roles of a multi-node allocation, with SLURM's own `scontrol`
expanding the node list, and the launcher preset sized from the placement.

The cluster needs Debian's slurm-wlm and munge (scripts/setup_slurm.sh installs them where the
tests run as root with apt-get, as CI does) and root (slurmd runs jobs as their user); elsewhere
these tests skip and say why."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hydra import compose, initialize_config_module

from molt_flashreinforce.launch.ray_cluster import RAY_PORT, first_hostname, slurm_role

REPO = Path(__file__).resolve().parents[1]
SBIN = "/usr/sbin"
DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "scontrol", "sinfo")
# Each job is a few seconds of training; the budget is Python and torch start-up.
TINY = ["experiment=tiny", "local.steps=2", "local.warm_start.steps=2", "local.eval.every=1", "local.task.eval_size=16",
        "local.rollouts_per_step=8", "local.progress_bar=false"]
JOB_TIMEOUT_S = 240


def _which(program: str) -> str | None:
    return shutil.which(program, path=f"{os.environ.get('PATH', '')}:{SBIN}")


def _missing() -> str | None:
    absent = [p for p in DAEMONS + CLIENTS if _which(p) is None]
    if absent:
        return (f"SLURM is not installed here ({', '.join(absent)} missing); scripts/setup_slurm.sh installs "
                "Debian's slurm-wlm and munge where the tests run as root with apt-get")
    if os.geteuid() != 0:
        return "the one-node SLURM cluster runs slurmd as root (it starts jobs as their user); run the tests as root"
    return None


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


SLURM_CONF = """\
ClusterName=ci
SlurmctldHost={host}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={root}/munge.sock
CredType=cred/munge
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
# No cgroups and no accounting database: the smallest cluster that schedules and runs jobs.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
# Four CPU slots whatever the machine has, so the sweep's three jobs run at once.
SlurmdParameters=config_overrides
NodeName={host} NodeAddr=127.0.0.1 CPUs=4 State=UNKNOWN
PartitionName=ci Nodes=ALL Default=YES MaxTime=30 State=UP
"""


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    """Environment of a running one-node cluster; the daemons stop when the module's tests end."""
    reason = _missing()
    if reason:
        pytest.skip(reason)
    root = tmp_path_factory.mktemp("slurm")
    root.chmod(0o755)  # munged checks that its socket's directory is reachable
    (root / "state").mkdir()
    (root / "spool").mkdir()
    key = root / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    host = socket.gethostname().split(".")[0]
    conf = root / "slurm.conf"
    conf.write_text(SLURM_CONF.format(host=host, root=root, ctld_port=_free_port(), slurmd_port=_free_port()))
    env = {**os.environ, "SLURM_CONF": str(conf),
           "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}:{SBIN}"}
    daemons = []
    try:
        for argv in (
            [_which("munged"), "--foreground", "--force", f"--socket={root}/munge.sock", f"--key-file={key}",
             f"--log-file={root}/munged.log", f"--pid-file={root}/munged.pid", f"--seed-file={root}/munged.seed"],
            [_which("slurmctld"), "-D", "-i"],
            [_which("slurmd"), "-D"],
        ):
            log = open(root / f"{Path(argv[0]).name}.out", "w")
            daemons.append(subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT))
            time.sleep(0.5)  # slurmctld needs munged's socket, slurmd needs slurmctld
        deadline = time.monotonic() + 60
        while True:
            state = subprocess.run(["sinfo", "-h", "-o", "%T"], env=env, capture_output=True, text=True).stdout.strip()
            if state == "idle":
                break
            if time.monotonic() > deadline:
                logs = "\n".join(p.read_text()[-1500:] for p in sorted(root.glob("*.out")) + sorted(root.glob("*.log")))
                pytest.fail(f"the one-node SLURM cluster did not become idle (sinfo: {state!r}):\n{logs}")
            time.sleep(0.5)
        yield env
    finally:
        for daemon in reversed(daemons):
            daemon.terminate()
        for daemon in daemons:
            try:
                daemon.wait(timeout=20)
            except subprocess.TimeoutExpired:
                daemon.kill()


def wait_for(job_id: str, env: dict[str, str]) -> str:
    """The job's final state, polled through scontrol (sbatch --wait polls once per 32 s at most)."""
    deadline = time.monotonic() + JOB_TIMEOUT_S
    while time.monotonic() < deadline:
        shown = subprocess.run(["scontrol", "show", "job", job_id, "-o"], env=env, capture_output=True, text=True).stdout
        state = next((f.partition("=")[2] for f in shown.split() if f.startswith("JobState=")), "")
        if state not in ("", "PENDING", "RUNNING", "CONFIGURING", "COMPLETING"):
            return state
        time.sleep(0.5)
    raise AssertionError(f"SLURM job {job_id} did not finish in {JOB_TIMEOUT_S} s")


@pytest.mark.slow
def test_multirun_through_the_molt_slurm_launcher_survives_a_failing_job(slurm, tmp_path):
    sweep = tmp_path / "sweep"
    done = subprocess.run(
        [sys.executable, "-m", "molt_flashreinforce", "-m", "hydra/launcher=molt_slurm", "hydra.launcher.partition=ci",
         # the tiny experiment needs no GPU and one CPU
         "hydra.launcher.gpus_per_node=null", "hydra.launcher.cpus_per_task=1", "hydra.launcher.timeout_min=10",
         *TINY, "local.policy_lag=0,1,-1", f"hydra.sweep.dir={sweep}"],
        cwd=tmp_path, env=slurm, capture_output=True, text=True, timeout=JOB_TIMEOUT_S,
    )
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
    # One node, no GPU, one CPU: command-line options override the script's #SBATCH lines.
    submitted = subprocess.run(
        ["sbatch", "--parsable", "--nodes=1", "--gpus-per-node=0", "--cpus-per-task=1", "--time=10",
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


def test_scontrol_expands_the_node_list_to_its_first_host(scontrol):
    assert first_hostname("gpu[03-04]") == "gpu03"
    assert first_hostname("a[09-10],b01") == "a09"


def allocation(procid: str, nodes: int = 2, ntasks: int | None = None) -> dict[str, str]:
    return {"SLURM_PROCID": procid, "SLURM_JOB_NUM_NODES": str(nodes), "SLURM_NTASKS": str(ntasks or nodes),
            "SLURM_JOB_NODELIST": "gpu[03-04]"}


def test_outside_slurm_or_on_one_node_molt_starts_its_own_ray():
    assert slurm_role({}) is None
    assert slurm_role(allocation("0", nodes=1)) is None


def test_task_zero_is_the_head_and_the_others_join_it(scontrol):
    head = slurm_role(allocation("0"))
    worker = slurm_role(allocation("1"))
    assert head.is_head and not worker.is_head
    assert head.address == worker.address == f"gpu03:{RAY_PORT}"
    assert head.nodes == 2


def test_more_than_one_task_per_node_is_refused():
    with pytest.raises(RuntimeError, match="hydra.launcher.tasks_per_node=1"):
        slurm_role(allocation("0", ntasks=16))


def test_slurm_preset_takes_nodes_and_gpus_from_the_placement():
    with initialize_config_module(config_module="molt_flashreinforce.conf", version_base="1.3"):
        cfg = compose(config_name="config", overrides=["experiment=moe_lag8_qwen3_30b_a3b",
                                                       "hydra/launcher=molt_slurm"], return_hydra_config=True)
    launcher = cfg.hydra.launcher
    assert (launcher.nodes, launcher.gpus_per_node, launcher.tasks_per_node) == (4, 8, 1)
    assert launcher._target_ == "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher"
