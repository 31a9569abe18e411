"""Bad input on the real command line, per backend: one line on stderr naming the key, the value and
the fix; exit status 2; no traceback; nothing printed twice; no run directory left behind. Plus the
validation layer's pieces in process (run-directory cleanup)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hydra import compose, initialize_config_module

from molt_flashreinforce.launch import validate as validation
from molt_flashreinforce.app import dispatch
from molt_flashreinforce.app.shell import remove_unused_run_dir
from molt_flashreinforce.launch.errors import LaunchError

PREFIX = "molt-flashreinforce: error: "


def run_cli(cwd: Path, *arguments: str, **env: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k != "MOLT_FLASHREINFORCE_DEBUG"}
    return subprocess.run([sys.executable, "-m", "molt_flashreinforce", *arguments], cwd=cwd,
                          capture_output=True, text=True, env={**environ, **env}, timeout=300)


def assert_refused_once(done: subprocess.CompletedProcess, expected: str, cwd: Path) -> None:
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1 and done.stderr.startswith(PREFIX), done.stderr
    assert expected in done.stderr
    assert "Traceback" not in done.stderr and "HYDRA_FULL_ERROR" not in done.stderr
    assert not (cwd / "runs").exists(), sorted(str(p) for p in (cwd / "runs").rglob("*"))


LOCAL_CASES = {
    "negative delta": (["algo.delta=-0.001"],
                       "algo.delta=-0.001 must be >= 0 (a trust-region bound on a KL); use algo.delta=inf"),
    "delta not a number": (["algo.delta=abc"], "algo.delta=abc is not a number; use a bound >= 0 such as algo.delta=3e-3"),
    "gate level typo": (["algo.gate_level=tokn"],
                        "algo.gate_level=tokn is not one of sequence, token; did you mean algo.gate_level=token?"),
    "negative steps": (["local.steps=-5"], "local.steps=-5 must be a positive integer; set local.steps=<an integer >= 1>"),
    "key typo": (["algo.detla=1e-3"], "algo.detla=1e-3: algo.detla is not a key of the config; did you mean algo.delta?"),
    "nested key typo": (["local.warm_start.stpes=3"], "did you mean local.warm_start.steps?"),
    "option typo": (["algo=grpoo"], "algo=grpoo: algo has no option 'grpoo'; did you mean algo=grpo?"),
    "group does not divide the batch": (["algo=grpo", "local.rollouts_per_step=6"],
                                        "local.rollouts_per_step=6 is not a multiple of algo.group_size=4"),
    "added key the backend lacks": (["+local.stpes=3"], "local.stpes is not a key of the CPU backend's config; "
                                                        "did you mean local.steps?"),
}


@pytest.mark.parametrize("overrides, expected", LOCAL_CASES.values(), ids=LOCAL_CASES.keys())
def test_local_backend_refuses_bad_input_in_one_line(tmp_path, overrides, expected):
    started = time.monotonic()
    done = run_cli(tmp_path, "experiment=tiny", *overrides)
    assert_refused_once(done, expected, tmp_path)
    # No training starts (the tiny job's warm start alone takes about 40 s); the refusal itself
    # takes about a second on an idle machine.
    assert time.monotonic() - started < 30


MOLT_CASES = {
    "negative delta": (["algo.delta=-1"], "algo.delta=-1 must be >= 0"),
    "group size with FlashREINFORCE": (["algo.group_size=4"], "algo.group_size=4: FlashREINFORCE uses one rollout per prompt"),
    "batch is not one step": (["molt.train.batch_size=64"], "molt.train.batch_size=64 but molt.rollout.batch_size x "
                                                           "algo.group_size = 128 x 1 = 128"),
    "top-p with importance sampling": (["molt.rollout.top_p=0.9"], "molt.rollout.top_p=0.9 with importance sampling"),
    "more GPUs than the placement": (["placement.vllm.engines=20"], "placement needs 2 actor GPUs + 20 vLLM engines"),
    "no model": (["model.name_or_path=null"], "model.name_or_path is not set"),
    "entropy filter out of range": (["algo.entropy_filter_q=1.5"], "algo.entropy_filter_q=1.5 must lie in [0, 1]"),
    "unknown backend": (["backend=gpu"], "backend=gpu is not one of local, molt"),
}


@pytest.mark.parametrize("overrides, expected", MOLT_CASES.values(), ids=MOLT_CASES.keys())
def test_molt_backend_refuses_bad_input_in_one_line(tmp_path, overrides, expected):
    done = run_cli(tmp_path, "experiment=math_qwen2p5_1p5b", "dry_run=true", *overrides)
    assert_refused_once(done, expected, tmp_path)


@pytest.mark.slow
def test_molt_backend_refuses_what_only_molts_parser_knows_in_one_line(tmp_path):
    """Keys that only Molt's flag table can check (Molt is imported for them, after the line that says so)."""
    done = run_cli(tmp_path, "experiment=math_qwen2p5_1p5b", "dry_run=true", "molt.train.max_epochs=2")
    assert done.returncode == 2
    assert done.stdout.startswith("Checking the flags with Molt's own parser")
    assert done.stderr.count("\n") == 1 and done.stderr.startswith(PREFIX + "molt.train.max_epochs")
    assert not (tmp_path / "runs").exists()


def test_debug_flag_adds_the_traceback(tmp_path):
    done = run_cli(tmp_path, "experiment=tiny", "algo.delta=abc", MOLT_FLASHREINFORCE_DEBUG="1")
    assert done.returncode == 2
    assert "Traceback (most recent call last)" in done.stderr and "validate.py" in done.stderr
    assert done.stderr.rstrip().splitlines()[-1].startswith(PREFIX + "algo.delta=abc is not a number")


def test_a_refused_job_of_a_sweep_keeps_its_log_and_the_others_run(tmp_path):
    sweep = tmp_path / "sweep"
    done = run_cli(tmp_path, "-m", "experiment=tiny", "dry_run=true", "algo.delta=-1,1e-3", f"hydra.sweep.dir={sweep}")
    assert done.returncode == 2
    assert done.stderr.count("algo.delta=-1 must be >= 0") == 1 and "Traceback" not in done.stderr
    assert "1 job(s) of the sweep refused" in done.stderr
    refused, good = sorted(d for d in sweep.iterdir() if d.is_dir())
    assert "refused: algo.delta=-1 must be >= 0" in (refused / "app.log").read_text()
    assert not (refused / "launch").exists() and (good / "launch" / "config.yaml").is_file()


def test_a_swept_key_unknown_in_one_of_the_swept_options_is_refused_before_any_job(tmp_path):
    done = run_cli(tmp_path, "-m", "experiment=tiny", "algo=flashreinforce,grpo", "algo.delta=1e-3")
    assert_refused_once(done, "algo.delta is not a key of the config (with experiment=tiny algo=grpo); "
                              "algo has: name, group_size, clip_eps, reduction", tmp_path)


def test_a_slurm_warning_lead_as_long_as_the_time_limit_is_refused_before_any_job(tmp_path):
    """The launcher's default lead (900 s) within a 10-minute limit: SLURM would warn each job at once."""
    done = run_cli(tmp_path, "-m", "hydra/launcher=molt_slurm", "hydra.launcher.partition=local",
                   "hydra.launcher.timeout_min=10", "experiment=tiny", "local.policy_lag=0,1")
    assert_refused_once(done, "hydra.launcher.signal_delay_s=900 is not shorter than hydra.launcher.timeout_min=10 "
                              "(600 s): SLURM would send its time-limit warning at once and every job would requeue "
                              "itself before training; set hydra.launcher.signal_delay_s=60", tmp_path)
    assert not (tmp_path / "multirun").exists()


def test_missing_experiment_is_one_line_with_the_choices(tmp_path):
    done = run_cli(tmp_path, "dry_run=true")
    assert_refused_once(done, "experiment is not set; pass experiment=<name>, one of: alfworld_qwen2p5_7b, "
                              "long_horizon_r1_distill_1p5b, math_qwen2p5_1p5b", tmp_path)


def test_help_with_an_experiment_starts_with_the_app_not_with_hydra(tmp_path):
    done = run_cli(tmp_path, "experiment=tiny", "--help")
    assert done.returncode == 0
    first = done.stdout.splitlines()[0]
    assert first.startswith("molt-flashreinforce: train with FlashREINFORCE") and "powered by Hydra" not in done.stdout
    assert "algo: flashreinforce, grpo" in done.stdout and "backend: local" in done.stdout


def compose_config(*overrides: str):
    with initialize_config_module(config_module=validation.CONFIG_MODULE, version_base="1.3"):
        return compose(config_name=validation.CONFIG_NAME, overrides=list(overrides))


@pytest.mark.parametrize("overrides", [
    ["experiment=tiny"], ["experiment=tiny", "algo=grpo"], ["experiment=tiny", "algo.delta=inf"],
    ["experiment=math_qwen2p5_1p5b"], ["experiment=python_tool_qwen2p5_7b", "algo=grpo"],
    ["experiment=moe_lag8_qwen3_30b_a3b"], ["experiment=long_horizon_r1_distill_1p5b", "algo.delta=inf"],
    ["experiment=alfworld_qwen2p5_7b", "algo=grpo"],
])
def test_every_shipped_experiment_passes(overrides):
    dispatch.validate(compose_config(*overrides))


@pytest.mark.parametrize("overrides, message", [
    (["algo.gate_level=token", "algo.gate_mean=geometric"], "algo.gate_mean=geometric needs algo.gate_level=sequence"),
    (["algo.reduction=constant_length"], "algo.constant_length=None must be an integer >= 1"),
    (["algo.constant_length=6144"], "algo.constant_length=6144 is only used by algo.reduction=constant_length"),
    (["algo.importance_sampling=maybe"], "algo.importance_sampling=maybe must be true or false"),
    (["algo=grpo", "algo.clip_eps=0"], "algo.clip_eps=0 must lie in (0, 1)"),
    (["seed=-1"], "seed=-1 must be an integer >= 0"),
    (["local.lr=abc"], "local.lr=abc must be a positive finite number"),
    (["local.adam_betas=[0.9,x]"], "local.adam_betas=[0.9, 'x'] must be two numbers in [0, 1)"),
    (["algo.max_policy_lag=-1"], "algo.max_policy_lag=-1 must be an integer >= 0; use a number of optimizer updates"),
    (["algo.max_policy_lag=2.5"], "algo.max_policy_lag=2.5 must be an integer >= 0"),
    (["local.policy_lag=3", "algo.max_policy_lag=2"], "local.policy_lag=3 exceeds algo.max_policy_lag=2"),
])
def test_validate_names_the_key_the_value_and_the_fix(overrides, message):
    with pytest.raises(LaunchError) as error:
        dispatch.validate(compose_config("experiment=tiny", *overrides))
    assert message in str(error.value) and "\n" not in str(error.value)


def test_only_a_run_directory_holding_hydras_files_is_removed(tmp_path):
    refused = tmp_path / "runs" / "tiny" / "flashreinforce" / "t1"
    (refused / ".hydra").mkdir(parents=True)
    (refused / "app.log").write_text("refused: ...\n")
    sibling = tmp_path / "runs" / "other"
    sibling.mkdir()
    remove_unused_run_dir(refused, tmp_path)
    assert not (tmp_path / "runs" / "tiny").exists() and sibling.is_dir()  # empty parents go, up to a non-empty one

    resumed = tmp_path / "resumed"
    (resumed / ".hydra").mkdir(parents=True)
    (resumed / "checkpoints").mkdir()
    remove_unused_run_dir(resumed, tmp_path)
    assert (resumed / "checkpoints").is_dir()  # a directory with the user's work is never removed

    (tmp_path / ".hydra").mkdir()
    remove_unused_run_dir(tmp_path, tmp_path)  # hydra.run.dir=. : the launch directory itself stays
    assert (tmp_path / ".hydra").is_dir()


@pytest.mark.parametrize("overrides, message", [
    # 1,024 in flight / 128 per update: rollouts may wait 8 batches, more than a bound of 6 allows.
    (["experiment=moe_lag8_qwen3_30b_a3b", "algo.max_policy_lag=6"],
     "molt.rollout.vllm_generate_batch_size=1024 keeps rollouts in flight for up to 8 batches of 128 under partial "
     "rollout, more than algo.max_policy_lag=6 allows"),
    # Molt turns partial rollout on by itself above one batch in flight: 16 > 8 games per update.
    (["experiment=alfworld_qwen2p5_7b", "algo=grpo", "molt.rollout.vllm_generate_batch_size=24"],
     "up to 3 batches of 8 under partial rollout, more than algo.max_policy_lag=1 allows"),
    (["experiment=math_qwen2p5_1p5b", "algo.max_policy_lag=0", "++molt.train.partial_rollout_enable=true"],
     "at most 0 or turn partial rollout off"),
    (["experiment=moe_lag8_qwen3_30b_a3b", "++molt.ckpt.warm_resume_rollouts=true"],
     "molt.ckpt.warm_resume_rollouts=true with algo.max_policy_lag=8: the rollouts it restores carry no policy version"),
])
def test_a_lag_bound_the_runtime_could_not_hold_is_refused(overrides, message):
    with pytest.raises(LaunchError) as error:
        dispatch.validate(compose_config(*overrides))
    assert message in str(error.value) and "\n" not in str(error.value)


def test_the_paper_bounds_are_set_and_within_their_pools():
    for experiment, algo, bound in (("moe_lag8_qwen3_30b_a3b", "flashreinforce", 8), ("moe_lag8_qwen3_30b_a3b", "grpo", 1),
                                    ("long_horizon_r1_distill_1p5b", "flashreinforce", 4),
                                    ("math_qwen2p5_1p5b", "grpo", 1)):
        cfg = compose_config(f"experiment={experiment}", f"algo={algo}")
        assert cfg.algo.max_policy_lag == bound
        dispatch.validate(cfg)
