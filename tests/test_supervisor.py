"""The supervisor's decisions, each on real child processes that behave as one attempt of Molt's
driver would (they write the progress files Molt's workers write, plugin/progress.py), and the
pieces it relies on: which dead actors count as faults (Ray's own death-cause messages), the
checkpoint Molt saves on request (Molt's own `save_logs_and_checkpoints`), and the run records.

The fault-injection runs through Molt's real runtime are in tests/test_rehearsal_runs.py.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from molt_flashreinforce.cluster import processes, supervisor
from molt_flashreinforce.cluster.actor_watch import actor_fault, find_fault
from molt_flashreinforce.cluster.progress import FAILURE_FILE
from molt_flashreinforce.cluster.errors import ClusterError
from molt_flashreinforce.cluster.ray_nodes import NODE_RESOURCE
from molt_flashreinforce.launch.records import wandb_resume_env
from molt_flashreinforce.cluster import progress as progress_files
from molt_flashreinforce.plugin import progress

VLLM_STANDIN = Path(__file__).parents[1] / "molt_flashreinforce" / "rehearsal" / "vllm_standin"
FAST = supervisor.Resilience(max_restarts=2, stall_timeout_s=2.0, startup_timeout_s=3.0, checkpoint_wait_s=5.0,
                             max_requeues=3)

# One attempt of "Molt": behaviour by attempt number (argv[1]); progress goes where the supervisor says.
ATTEMPT = textwrap.dedent("""
    import json, os, pathlib, sys, time
    attempt, behaviour = int(sys.argv[1]), sys.argv[2].split(",")
    where = pathlib.Path(os.environ["MOLT_FLASHREINFORCE_PROGRESS_DIR"])
    def step(n):
        (where / "step.json").write_text(json.dumps({"step": n, "time": time.time()}))
    what = behaviour[min(attempt, len(behaviour) - 1)]
    if what == "broken":  # an actor's constructor raises (the agent file, a config error): no step yet
        (where / "failure.json").write_text(json.dumps(
            {"what": "actor GenerateSamplesActor", "node": "n1", "step": 0, "cause": "its constructor raised",
             "code_fault": True}))
        sys.exit(75)
    if what == "lost_port":  # the policy actor's process group finds its port taken (Molt picked it, then let go)
        import socket, traceback
        from datetime import timedelta
        import ray.exceptions
        from torch.distributed import TCPStore
        from molt_flashreinforce.cluster import port_race
        taken = socket.socket(); taken.bind(("127.0.0.1", 0)); taken.listen()
        try:
            TCPStore("127.0.0.1", taken.getsockname()[1], 1, True, timeout=timedelta(seconds=5))
        except Exception as raised:  # as Molt's driver gets it from the actor's method
            error = ray.exceptions.RayTaskError(
                "init_model_from_pretrained", traceback.format_exc(), raised, pid=9,
                proctitle="ray::PolicyModelActor.init_model_from_pretrained", ip="10.0.0.7").as_instanceof_cause()
            assert port_race.record(error, str(where))
            sys.exit(1)
    step(1)
    if what == "finish":
        step(2); sys.exit(0)
    if what == "die":  # as cluster/actor_watch.py ends Molt's driver
        print("molt-flashreinforce: actor RolloutRayActor died on node n2 at step 1: its worker process died (pid 7)")
        (where / "failure.json").write_text(json.dumps(
            {"what": "actor RolloutRayActor", "node": "n2", "step": 1, "cause": "its worker process died (pid 7)"}))
        sys.exit(75)
    if what == "hang":
        time.sleep(600)
    if what == "serve":  # answers a checkpoint request at its next "step", then keeps running
        while True:
            request = where / "checkpoint_request"
            if request.exists():
                step(3)
                (where / "checkpoint_done.json").write_text(json.dumps({"id": json.loads(request.read_text())["id"], "step": 3}))
            time.sleep(0.2)
    if what == "refused":  # a Ray worker found a Molt that drifted (plugin/ray_hooks.py): the driver runs on
        (where / "failure.json").write_text(json.dumps(
            {"what": "a Ray worker (pid 8)", "node": "n2", "step": 1, "code_fault": True, "every_attempt": True,
             "cause": "Molt's molt.models.loss.PolicyLoss.forward takes (self), not (...): ..."}))
        time.sleep(600)
    if what == "deaf":  # keeps reporting rollouts, never reaches a step boundary
        while True:
            (where / "rollout").touch(); time.sleep(0.5)
""")


def attempts_of(behaviour: str, tmp_path: Path):
    counter = iter(range(100))
    started = []

    def start(env):
        process = subprocess.Popen([sys.executable, "-c", ATTEMPT, str(next(counter)), behaviour],
                                   env={**os.environ, **env})
        started.append(process)
        return process

    return start, started


def test_a_crash_is_restarted_from_the_checkpoint_and_every_attempt_is_recorded(tmp_path, capfd):
    start, started = attempts_of("die,finish", tmp_path)
    restarted = []
    run = supervisor.Supervisor(tmp_path, FAST, checkpoint_step=lambda: 1 if started else 0)
    assert run.run(start, before_restart=lambda: restarted.append(True)) == 1
    out = capfd.readouterr().out
    # One line names what died: the driver's (the supervisor does not repeat it).
    assert out.count("actor RolloutRayActor died on node n2 at step 1: its worker process died (pid 7)") == 1
    assert "restart 1 of 2: resuming from the checkpoint at step 1" in out
    assert restarted == [True] and len(started) == 2
    attempts = supervisor.read_attempts(tmp_path)
    assert [a["attempt"] for a in attempts] == [0, 1]
    assert [a["resumed_from_step"] for a in attempts] == [0, 1]
    assert attempts[0]["cause"].endswith("its worker process died (pid 7)") and attempts[0]["last_step"] == 1
    assert attempts[1]["cause"] == "finished" and attempts[1]["last_step"] == 2
    assert not (tmp_path / supervisor.PROGRESS_SUBDIR / FAILURE_FILE).exists()  # each attempt starts clean


def test_a_code_fault_before_the_first_step_is_not_restarted(tmp_path):
    start, started = attempts_of("broken", tmp_path)
    with pytest.raises(ClusterError, match="its constructor raised; not restarted: it failed before its first optimizer step"):
        supervisor.Supervisor(tmp_path, FAST, checkpoint_step=lambda: 0).run(start)
    assert len(started) == 1


def test_a_port_lost_before_the_first_step_is_restarted(tmp_path, capfd):
    start, started = attempts_of("lost_port,finish", tmp_path)
    run = supervisor.Supervisor(tmp_path, FAST, checkpoint_step=lambda: 0)
    assert run.run(start) == 1 and len(started) == 2
    out = capfd.readouterr()
    line = re.search(r"molt-flashreinforce: PolicyModelActor.init_model_from_pretrained died on node 10.0.0.7 at step 0: "
                     r"its process group's port (\d+) was taken by another process .* a new attempt chooses new ports",
                     out.err)
    assert line, out.err
    assert "restart 1 of 2: resuming from the checkpoint at step 0" in out.out
    first = supervisor.read_attempts(tmp_path)[0]
    assert first["outcome"] == supervisor.FAULT and first["last_step"] is None and first["cause"] == line.group(0)


def test_only_a_lost_port_is_taken_for_a_port_race():
    from datetime import timedelta

    import ray.exceptions
    from torch.distributed import DistNetworkError, TCPStore

    from molt_flashreinforce.cluster import port_race

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(DistNetworkError) as in_use:
            TCPStore("127.0.0.1", port, 1, True, timeout=timedelta(seconds=5))
    assert port_race.lost_port(in_use.value) == str(port)
    # As Molt's driver gets it from an actor's method: Ray's error, an instance of the cause's class too.
    assert port_race.lost_port(ray.exceptions.RayTaskError("f", "", in_use.value).as_instanceof_cause()) == str(port)
    refused = DistNetworkError("The client socket has failed to connect to 127.0.0.1:1 (errno: 111 - Connection refused)")
    assert port_race.lost_port(refused) is None
    assert port_race.lost_port(ValueError("port: 1 EADDRINUSE")) is None
    assert port_race.record(ValueError("no"), None) is False


def test_a_worker_that_refuses_molt_ends_the_attempt_at_once_in_its_line(tmp_path):
    start, started = attempts_of("refused", tmp_path)
    with pytest.raises(ClusterError) as raised:
        supervisor.Supervisor(tmp_path, FAST, checkpoint_step=lambda: 0).run(start)
    message = str(raised.value)
    assert "\n" not in message and message.startswith(
        "a Ray worker (pid 8) died on node n2 at step 1: Molt's molt.models.loss.PolicyLoss.forward takes (self)")
    assert "not restarted" in message and len(started) == 1 and started[0].poll() is not None


def test_restarts_used_up_end_the_run_in_one_line_that_keeps_the_run_directory(tmp_path):
    start, started = attempts_of("die", tmp_path)
    with pytest.raises(ClusterError) as raised:
        supervisor.Supervisor(tmp_path, FAST, checkpoint_step=lambda: 0).run(start)
    message = str(raised.value)
    assert "\n" not in message and "resilience.max_restarts=2 used up" in message and str(tmp_path) in message
    assert len(started) == 3 and len(supervisor.read_attempts(tmp_path)) == 3


def test_a_stall_writes_every_process_stack_then_restarts(tmp_path, capsys):
    start, started = attempts_of("hang,finish", tmp_path)
    assert supervisor.Supervisor(tmp_path, FAST, checkpoint_step=lambda: 0).run(start) == 1
    cause = supervisor.read_attempts(tmp_path)[0]["cause"]
    assert "stalled: no optimizer step and no finished rollout for 2 s (resilience.stall_timeout_s)" in cause
    stacks = list((tmp_path / supervisor.STACKS_SUBDIR / "attempt-0" / "head").glob("*.txt"))
    (hung,) = [path for path in stacks if path.name.startswith(f"{started[0].pid}-")]
    assert "time.sleep" in hung.read_text() or "<module>" in hung.read_text()  # py-spy read the hung process
    assert started[0].poll() is not None  # the hung attempt was stopped


def test_no_report_at_all_is_a_stall_after_the_startup_timeout(tmp_path):
    slow_start = supervisor.Resilience(max_restarts=0, stall_timeout_s=0.5, startup_timeout_s=2.0,
                                       checkpoint_wait_s=1.0, max_requeues=0)
    silent = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    with pytest.raises(ClusterError, match=r"no rollout or step since the start for 2 s \(resilience.startup_timeout_s\)"):
        supervisor.Supervisor(tmp_path, slow_start, checkpoint_step=lambda: 0).run(lambda env: silent)
    assert silent.poll() is not None


def _signal_soon(signum: int, after_s: float = 1.5) -> None:
    threading.Timer(after_s, os.kill, (os.getpid(), signum)).start()


@pytest.mark.parametrize("signum, why", [(signal.SIGUSR2, "time limit near (SIGUSR2)"),
                                         (signal.SIGTERM, "asked to stop (SIGTERM)")])
def test_slurms_signal_checkpoints_at_the_next_step_then_asks_for_a_requeue(tmp_path, signum, why):
    start, started = attempts_of("serve", tmp_path)
    _signal_soon(signum)
    with pytest.raises(supervisor.Requeue, match=re.escape(f"{why}: checkpoint at step 3")):
        supervisor.Supervisor(tmp_path, FAST, checkpoint_step=lambda: 3).run(start)
    assert started[0].poll() is not None
    (attempt,) = supervisor.read_attempts(tmp_path)
    assert attempt["last_step"] == 3 and "checkpoint at step 3" in attempt["cause"]
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL or callable(signal.getsignal(signal.SIGTERM))


def test_a_checkpoint_is_announced_only_when_molts_loader_would_resume_from_it(tmp_path):
    start, started = attempts_of("serve", tmp_path)  # answers the request with step 3
    _signal_soon(signal.SIGUSR2)
    with pytest.raises(supervisor.Requeue) as stopped:
        supervisor.Supervisor(tmp_path, FAST, checkpoint_step=lambda: 2).run(start)  # step 3 never completed
    assert str(stopped.value).endswith(
        "time limit near (SIGUSR2): Molt saved step 3 but no complete checkpoint of it is on disk; "
        "the last complete one stands (step 2)")
    assert "checkpoint at step" not in supervisor.read_attempts(tmp_path)[0]["cause"]


def test_the_history_of_a_launch_covers_its_requeued_runs(tmp_path, monkeypatch):
    """As seen on a full test run: a crash, a restart, SLURM's signal with a checkpoint at step 3, a
    requeue (a new process of the same SLURM job), the end. attempts.json has all three, and so
    does the launch's history; an earlier launch in the same run directory does not count."""
    monkeypatch.setattr(supervisor.slurm, "job_state", lambda job: "RUNNING")
    supervisor.Supervisor(tmp_path, FAST, checkpoint_step=lambda: 0, job="40").run(attempts_of("finish", tmp_path)[0])
    first_run, _ = attempts_of("die,serve", tmp_path)
    _signal_soon(signal.SIGUSR2, after_s=4.0)  # during the second attempt
    with pytest.raises(supervisor.Requeue, match="checkpoint at step 3"):
        supervisor.Supervisor(tmp_path, FAST, checkpoint_step=lambda: 3 if len(supervisor.read_attempts(tmp_path)) > 2 else 0,
                              job="41").run(first_run)
    requeued = supervisor.Supervisor(tmp_path, FAST, checkpoint_step=lambda: 3, job="41")
    assert requeued.run(attempts_of("finish", tmp_path)[0]) == 1
    history = supervisor.history(tmp_path, requeued.launch)
    assert history == supervisor.History(attempts=3, restarts=1, requeues=1, resumed_from=(0, 0, 3))
    assert [a["outcome"] for a in supervisor.read_attempts(tmp_path)] == ["finished", "fault", "stopped", "finished"]


def test_the_checkpoint_counted_is_the_one_molts_loader_resumes_from(tmp_path):
    from molt_flashreinforce.plugin.seams import checkpoint_step, resumable_checkpoint

    actor_dir = tmp_path / "_actor"
    assert resumable_checkpoint(actor_dir) is None and checkpoint_step(None) == 0
    for step in (2, 4):
        (actor_dir / f"global_step{step}" / "model").mkdir(parents=True)
        (actor_dir / f"global_step{step}" / "extra_state.pt").write_bytes(b"")
        os.utime(actor_dir / f"global_step{step}", (step, step))  # saved in step order
    (actor_dir / "latest").write_text("global_step2")  # Molt's own marker wins over the newer directory
    assert checkpoint_step(resumable_checkpoint(actor_dir)) == 2
    (actor_dir / "latest").write_text("global_step6")  # a tag whose save never completed: the newest complete one
    assert checkpoint_step(resumable_checkpoint(actor_dir)) == 4


@pytest.mark.parametrize("state, outcome", [("COMPLETING", "ended"), ("RUNNING", "requeue")])
def test_sigterm_of_a_job_slurm_is_ending_stops_at_once_without_a_requeue(tmp_path, monkeypatch, state, outcome):
    """What slurmctld shows decides (the real cluster's answer is in test_rehearsal_runs: a plain
    scancel shows COMPLETING, `scancel --signal=TERM` RUNNING)."""
    monkeypatch.setattr(supervisor.slurm, "job_state", lambda job: state)
    start, started = attempts_of("serve", tmp_path)
    _signal_soon(signal.SIGTERM)
    expected = processes.Terminated if outcome == "ended" else supervisor.Requeue
    with pytest.raises(expected):
        supervisor.Supervisor(tmp_path, FAST, checkpoint_step=lambda: 3, job="41").run(start)
    assert started[0].poll() is not None
    (attempt,) = supervisor.read_attempts(tmp_path)
    assert ("is ending (COMPLETING, SIGTERM): stopped at once" in attempt["cause"]) == (outcome == "ended")


def test_a_checkpoint_that_does_not_come_in_time_falls_back_to_the_last_complete_one(tmp_path):
    start, started = attempts_of("deaf", tmp_path)
    _signal_soon(signal.SIGUSR2)
    quick = supervisor.Resilience(max_restarts=0, stall_timeout_s=30, startup_timeout_s=30, checkpoint_wait_s=1.0,
                                  max_requeues=1)
    with pytest.raises(supervisor.Requeue, match="no checkpoint within 1 s, the last complete one stands"):
        supervisor.Supervisor(tmp_path, quick, checkpoint_step=lambda: 0).run(start)


def test_requeue_outside_slurm_stops_with_one_line(monkeypatch):
    for name in ("SLURM_PROCID", "SLURM_JOB_ID"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ClusterError, match=re.escape("stopped (not under SLURM, so not requeued): run the same command again")):
        supervisor.requeue_and_wait(FAST, "asked to stop (SIGTERM): checkpoint at step 3")


def test_requeues_are_capped(monkeypatch):
    monkeypatch.setenv("SLURM_PROCID", "0")
    monkeypatch.setenv("SLURM_JOB_ID", "41")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "3")
    with pytest.raises(ClusterError, match=r"job 41 was requeued 3 times already \(resilience.max_requeues=3\)"):
        supervisor.requeue_and_wait(FAST, "time limit near (SIGUSR2): checkpoint at step 9")


def _dead(reason: str | None = None, constructor_failed: bool = False, oom: bool = False):
    from ray.core.generated.common_pb2 import ActorDeathCause, ActorDiedErrorContext

    cause = ActorDeathCause()
    if constructor_failed:
        cause.creation_task_failure_context.formatted_exception_string = "Traceback ..."
    elif oom:
        cause.oom_context.error_message = "Task was killed due to the node running low on memory."
    else:
        cause.actor_died_error_context.reason = ActorDiedErrorContext.Reason.Value(reason)
        cause.actor_died_error_context.pid = 4242
    return cause


@pytest.mark.parametrize("reason, fault", [
    ("WORKER_DIED", "its worker process died (pid 4242)"),
    ("NODE_DIED", "its node died (pid 4242)"),
    ("RAY_KILL", None),  # Molt ending its own actors
    ("OUT_OF_SCOPE", None),
    ("OWNER_DIED", None),  # a consequence: the owner's own death is the fault reported
])
def test_which_actor_deaths_are_faults(reason, fault):
    assert actor_fault({"State": "DEAD", "DeathCause": _dead(reason)}) == fault
    assert actor_fault({"State": "DEAD", "DeathCause": _dead(oom=True)}) == "it ran out of memory"
    assert actor_fault({"State": "ALIVE", "DeathCause": None}) is None


def test_a_fault_names_the_actor_and_its_slurm_node_and_ignores_other_jobs():
    nodes = [{"NodeID": "a", "Alive": True, "NodeManagerHostname": "h", "Resources": {f"{NODE_RESOURCE}n2": 1.0}}]
    engine = {"JobID": "02000000", "State": "DEAD", "ActorClassName": "RolloutRayActor", "Address": {"NodeID": "a"},
              "DeathCause": _dead("WORKER_DIED")}
    assert find_fault([engine], nodes, "01000000", {}) is None
    assert find_fault([engine], nodes, "02000000", {}) == {
        "what": "actor RolloutRayActor", "node": "n2", "cause": "its worker process died (pid 4242)", "code_fault": False}
    constructor = {**engine, "DeathCause": _dead(constructor_failed=True)}
    assert find_fault([constructor], nodes, "02000000", {})["cause"] == "its constructor raised"
    assert find_fault([constructor], nodes, "02000000", {})["code_fault"]  # it would raise again
    # A dead node's entry has no resources left: it keeps the name it had while alive.
    lost = [{**nodes[0], "Alive": False, "Resources": {}, "DeathReasonMessage": "health check failed"}]
    assert find_fault([], lost, "02000000", {"a": "n2"}) == {"what": "Ray node", "node": "n2", "cause": "health check failed"}
    assert find_fault([{**engine, "DeathCause": _dead("NODE_DIED")}], lost, "02000000", {"a": "n2"})["node"] == "n2"
    assert find_fault([], lost, "02000000", {}) is None  # never seen alive by this job


class _ActorGroup:
    """Stands in for Molt's Ray actor group of FSDP policy actors (GPU processes, Ray): records the call."""

    def __init__(self):
        self.saved = []

    def async_run_method(self, method_name, **kwargs):
        self.saved.append((method_name, kwargs["tag"]))
        return []


def test_a_checkpoint_request_is_saved_by_molts_own_save_at_the_next_step(tmp_path, monkeypatch):
    monkeypatch.setenv(progress_files.PROGRESS_DIR_VARIABLE, str(tmp_path))
    if importlib.util.find_spec("vllm") is None:  # Molt's trainer module imports vLLM's SamplingParams only
        monkeypatch.syspath_prepend(str(VLLM_STANDIN))
    from molt.trainer import rl_trainer
    from molt.trainer.rl_trainer import BaseRLTrainer

    monkeypatch.setattr(rl_trainer.ray, "get", lambda refs: refs)  # the stand-in group's saves are done at once

    from molt_flashreinforce.plugin.ray_hooks import install_runtime_patches
    from molt_flashreinforce.plugin.seams import wrap_trainer

    class Trainer(BaseRLTrainer):  # Molt's method, on a class of our own
        pass

    install_runtime_patches()
    wrap_trainer(Trainer)
    trainer = object.__new__(Trainer)
    trainer.args = SimpleNamespace(logger=SimpleNamespace(logging_steps=1), ckpt=SimpleNamespace(save_steps=10))
    trainer.wandb_logger = trainer.tensorboard_logger = trainer.critic_model_group = None
    trainer.best_eval_metric_key, trainer.best_eval_metric_value, trainer._latest_eval_metric_value = None, None, None
    trainer.actor_model_group = _ActorGroup()

    trainer.save_logs_and_checkpoints(3, {}, {})
    assert trainer.actor_model_group.saved == []  # 10 does not divide 3
    assert progress_files.read_json(tmp_path / progress_files.STEP_FILE)["step"] == 3
    progress_files.write_json(tmp_path / progress_files.REQUEST_FILE, {"id": "r1"})
    trainer.save_logs_and_checkpoints(4, {}, {})
    assert trainer.actor_model_group.saved == [("save_checkpoint", "global_step4")]
    assert trainer.args.ckpt.save_steps == 10  # the run's own cadence is back
    assert progress_files.read_json(tmp_path / progress_files.DONE_FILE) == {"id": "r1", "step": 4}
    assert progress_files.pending_request(tmp_path) is None
    trainer.save_logs_and_checkpoints(5, {}, {})
    assert len(trainer.actor_model_group.saved) == 1  # answered once


def test_every_attempt_continues_one_wandb_run(tmp_path):
    first = wandb_resume_env(tmp_path)
    assert first["WANDB_RESUME"] == "allow" and len(first["WANDB_RUN_ID"]) == 8
    assert wandb_resume_env(tmp_path) == first
    assert json.dumps(first)  # plain strings, forwarded to the workers as they are
