"""Rendered Molt flags, parsed and validated by Molt's real `train_rl_ray` parser and checks, and
every bad input refused before any Ray or GPU work with an error that names the key."""

from __future__ import annotations

import json
import math
import shlex
from pathlib import Path

import pytest
from hydra import compose, initialize_config_module

from molt_flashreinforce import conf
from molt_flashreinforce.algo_settings import flag_settings
from molt_flashreinforce.launch import model_context
from molt_flashreinforce.launch.errors import LaunchError
from molt_flashreinforce.launch.job import prepare_molt_job
from molt_flashreinforce.launch.molt_cli import parse_and_validate
from molt_flashreinforce.launch.render import MOLT_ENTRY_MODULE
from molt_flashreinforce.launch.validate import validate

EXPERIMENTS = tuple(conf.paper_experiments())


# Steps whose HF export is kept: where each paper table is read (R1: its curve, every 1,024).
KEPT_EXPORTS = {"math_qwen2p5_1p5b": ([2000], None), "python_tool_qwen2p5_7b": ([600], None),
                "moe_lag8_qwen3_30b_a3b": ([800], None), "alfworld_qwen2p5_7b": ([200], None),
                "long_horizon_r1_distill_1p5b": ([], 1024)}


def compose_job(*overrides: str, dry_run: bool = True):
    with initialize_config_module(config_module="molt_flashreinforce.conf", version_base="1.3"):
        return compose(config_name="config", overrides=[f"dry_run={str(dry_run).lower()}", *overrides])


def prepare(tmp_path: Path, *overrides: str, dry_run: bool = True):
    return prepare_molt_job(compose_job(*overrides, dry_run=dry_run), tmp_path)


def recorded_argv(run_dir: Path) -> list[str]:
    words = shlex.split((run_dir / "launch" / "molt_command.sh").read_text().replace("\\\n", " "), comments=True)
    return words[words.index(MOLT_ENTRY_MODULE) + 1 :]


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_flashreinforce_renders_the_recipe_and_plugin_flags(tmp_path, experiment):
    cfg = compose_job(f"experiment={experiment}")
    job = prepare_molt_job(cfg, tmp_path)
    args = parse_and_validate(job.command.argv(missing="x"))
    advantage = args.algo.advantage
    assert (advantage.estimator, args.actor.loss_mode) == ("flashreinforce", "flashreinforce")
    assert (advantage.is_correction_level, advantage.is_correction_gating, advantage.is_correction_mode) == (
        "seq", "binary_kl", "mask")
    assert advantage.is_correction_threshold == [-math.inf, cfg.algo.delta]
    assert args.actor.loss_agg_mode == "seq-mean-token-mean"
    assert args.train.force_on_policy and args.train.max_epochs == 1
    assert args.rollout.n_samples_per_prompt == 1 and args.algo.kl.init_coef == 0
    # Every flag setting of the algorithm reaches Molt's parser with the config's value, except the fused
    # head, which needs the whole lm_head on each actor rank (ALFWorld's actor runs at tp 2).
    knobs = {setting.name: cfg.algo[setting.name] for setting in flag_settings()}
    knobs["fused_head"] = cfg.placement.actor.tp == 1 and cfg.placement.actor.cp == 1
    assert vars(args.flashreinforce) == {
        **knobs,
        # The steps the paper's table reports, exported and kept outside Molt's rotation (plugin/exports.py).
        "export_steps": KEPT_EXPORTS[experiment][0], "export_every": KEPT_EXPORTS[experiment][1],
        "export_dir": str(tmp_path / "exports"),
    }
    expected_model = model_context.extended_copy_path(cfg) or cfg.model.name_or_path
    assert args.actor.model_name_or_path == str(expected_model)
    assert args.train.batch_size == args.rollout.batch_size
    assert args.logger.tensorboard_dir == str(tmp_path / "tensorboard")
    assert args.ckpt.path == str(tmp_path / "ckpt" / "state") and not args.ckpt.load_enable
    assert job.command.env["MAX_AGENT_TURNS"] == str(cfg.agent.max_turns)


def test_fused_head_is_on_where_the_actor_holds_the_whole_head_and_refused_with_an_entropy_bonus(tmp_path):
    rendered = {placement: parse_and_validate(prepare_molt_job(compose_job(
        "experiment=math_qwen2p5_1p5b", f"placement={placement}"), tmp_path).command.argv(missing="x"))
        for placement in ("gpu8_actor1_vllm7", "gpu16_actor8tp2_vllm4tp2")}
    assert rendered["gpu8_actor1_vllm7"].flashreinforce.fused_head is True
    assert rendered["gpu16_actor8tp2_vllm4tp2"].flashreinforce.fused_head is False
    off = parse_and_validate(prepare_molt_job(compose_job("experiment=math_qwen2p5_1p5b", "algo.fused_head=false"),
                                              tmp_path).command.argv(missing="x"))
    assert off.flashreinforce.fused_head is False
    with pytest.raises(LaunchError, match=r"actor.entropy_coef=0.01 trains through them; set algo.fused_head=false"):
        prepare_molt_job(compose_job("experiment=math_qwen2p5_1p5b", "molt.actor.entropy_coef=0.01"), tmp_path)
    prepare_molt_job(compose_job("experiment=math_qwen2p5_1p5b", "molt.actor.entropy_coef=0.01",
                                 "algo.fused_head=false"), tmp_path)


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_grpo_renders_the_paper_baseline(tmp_path, experiment):
    cfg = compose_job(f"experiment={experiment}", "algo=grpo")
    args = parse_and_validate(prepare_molt_job(cfg, tmp_path).command.argv(missing="x"))
    assert (args.algo.advantage.estimator, args.actor.loss_mode) == ("grpo", "ppo")
    assert args.algo.advantage.no_whiten and args.actor.loss_agg_mode == "token-mean"
    assert args.algo.advantage.is_correction_level == "off"
    assert args.actor.eps_clip_low_high == [0.2, 0.2]
    assert args.rollout.n_samples_per_prompt == cfg.algo.group_size > 1
    assert args.train.batch_size == args.rollout.batch_size * cfg.algo.group_size
    assert args.train.force_on_policy and args.train.max_epochs == 1
    assert args.train.async_queue_size == 1 and not args.train.partial_rollout_enable
    assert args.rollout.vllm_generate_batch_size == args.rollout.batch_size  # Molt's own default
    assert args.flashreinforce.max_policy_lag == cfg.algo.max_policy_lag == 1  # the bound is every algorithm's


def test_unbounded_lag_renders_no_flag_and_is_refused_under_the_molt_node(tmp_path):
    job = prepare(tmp_path, "experiment=math_qwen2p5_1p5b", "algo.max_policy_lag=null")
    assert "--flashreinforce.max_policy_lag" not in job.command.argv(missing="x")
    assert parse_and_validate(job.command.argv(missing="x")).flashreinforce.max_policy_lag is None
    with pytest.raises(LaunchError, match="molt.flashreinforce.max_policy_lag is owned by algo.max_policy_lag"):
        prepare(tmp_path, "experiment=math_qwen2p5_1p5b", "++molt.flashreinforce.max_policy_lag=3")


def test_kept_exports_are_the_paper_tables_steps_and_configurable(tmp_path):
    flags = vars(parse_and_validate(prepare(tmp_path / "mine", "experiment=math_qwen2p5_1p5b", "exports.steps=[500,1000]",
                                            "exports.every=250").command.argv(missing="x")).flashreinforce)
    assert (flags["export_steps"], flags["export_every"]) == ([500, 1000], 250)
    none = prepare(tmp_path / "none", "experiment=math_qwen2p5_1p5b", "exports.steps=[]").command.argv(missing="x")
    assert not any(flag.startswith("--flashreinforce.export") for flag in none)
    for override, message in (("exports.steps=2000", "exports.steps=2000 must be a list of optimizer steps >= 1"),
                              ("exports.steps=[0]", "must be a list of optimizer steps >= 1"),
                              ("exports.every=0", "exports.every=0 must be an integer >= 1"),
                              ("rehearsal.export_steps=[-1]", "rehearsal.export_steps=\\[-1\\] must be a list")):
        with pytest.raises(LaunchError, match=message):
            validate(compose_job("experiment=math_qwen2p5_1p5b", "rehearsal=cpu", override))
    with pytest.raises(LaunchError, match="molt.flashreinforce.export_dir is owned by the run directory"):
        prepare(tmp_path / "owned", "experiment=math_qwen2p5_1p5b", "+molt.flashreinforce.export_dir=x")


def test_records_hold_a_runnable_command_and_the_launch_context(tmp_path):
    job = prepare(tmp_path, "experiment=python_tool_qwen2p5_7b", "molt.actor.adam.lr=2e-6")
    records = tmp_path / "launch"
    assert parse_and_validate(recorded_argv(tmp_path)) == parse_and_validate(job.command.argv())
    script = (records / "molt_command.sh").read_text()
    assert "MAX_AGENT_TURNS=10" in script and "--actor.adam.lr 2e-06" in script
    resolved = (records / "config.yaml").read_text()
    assert "train: data/python_tool_qwen2p5_7b/train.jsonl" in resolved  # ${data.dir} resolved
    assert "${" not in resolved
    versions = json.loads((records / "versions.json").read_text())
    assert versions["molt-rl"] == "0.2.1" and versions["python"]
    assert set(json.loads((records / "git.json").read_text())) == {"commit", "dirty"}
    assert "PATH" in json.loads((records / "environment.json").read_text())
    assert "data.train=" in (records / "warnings.txt").read_text()


def test_any_molt_flag_is_settable_under_the_molt_node(tmp_path):
    job = prepare(tmp_path, "experiment=math_qwen2p5_1p5b", "++molt.vllm.enable_prefix_caching=false",
                  "++molt.actor.adam.betas=[0.9,0.99]", "++molt.train.dynamic_batch_enable=true")
    args = parse_and_validate(job.command.argv())
    assert args.vllm.enable_prefix_caching is False and "--no-vllm.enable_prefix_caching" in job.command.argv()
    assert args.actor.adam.betas == [0.9, 0.99]
    assert args.train.dynamic_batch_enable is True


def test_wandb_key_is_read_at_launch_and_never_recorded(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", "secret-value-123")
    job = prepare(tmp_path, "experiment=math_qwen2p5_1p5b", "logger=wandb")
    assert parse_and_validate(job.command.argv()).logger.wandb.key == "secret-value-123"
    for record in (tmp_path / "launch").iterdir():
        assert "secret-value-123" not in record.read_text(), record.name
    assert '--logger.wandb.key "$WANDB_API_KEY"' in (tmp_path / "launch" / "molt_command.sh").read_text()


def test_rerun_in_a_run_directory_with_a_checkpoint_resumes(tmp_path):
    assert "--ckpt.load_enable" not in prepare(tmp_path, "experiment=math_qwen2p5_1p5b").command.argv()
    partial = tmp_path / "ckpt" / "state" / "_actor" / "global_step20"
    (partial / "model").mkdir(parents=True)  # extra_state.pt is written last: not finished yet
    assert "--ckpt.load_enable" not in prepare(tmp_path, "experiment=math_qwen2p5_1p5b").command.argv()
    (partial / "extra_state.pt").write_bytes(b"")
    args = parse_and_validate(prepare(tmp_path, "experiment=math_qwen2p5_1p5b").command.argv())
    assert args.ckpt.load_enable and args.ckpt.path == str(tmp_path / "ckpt" / "state")


# ── bad input: each refused with the key and the fix ──

@pytest.mark.parametrize(
    "overrides, message",
    [
        (["++molt.actor.adam.lrr=1e-6"], "molt.actor.adam.lrr is not a Molt train_rl_ray flag. Did you mean molt.actor.adam.lr?"),
        (["algo.group_size=4"], "algo.group_size=4: FlashREINFORCE uses one rollout per prompt"),
        (["++molt.rollout.n_samples_per_prompt=4"], "molt.rollout.n_samples_per_prompt is owned by algo.group_size"),
        (["molt.train.batch_size=256"], "Set molt.train.batch_size=128"),
        (["++molt.train.max_epochs=2"], "molt.train.max_epochs is owned by algo (one optimizer step per batch)"),
        # Force-on-policy at KL 0 is also why Molt runs no scoring forward in the actor before the step, whose
        # [S, V] logits the fused head would not avoid (Molt's experience_maker: skip_actor_old).
        (["++molt.algo.kl.init_coef=0.1"], "molt.algo.kl.init_coef is owned by algo (no reference KL)"),
        (["++molt.algo.advantage.is_correction_level=token"], "would apply importance correction twice"),
        (["++molt.algo.advantage.is_correction_threshold=[0.5,5.0]"], "would apply importance correction twice"),
        (["molt.rollout.top_p=0.95"], "molt.rollout.top_p=0.95 with importance sampling"),
        (["++molt.rollout.top_k=50"], "molt.rollout.top_k=50 with importance sampling"),
        (["algo.delta=-1e-3"], "algo.delta=-0.001 must be >= 0"),
        (["algo.delta=nan"], "algo.delta=nan must be >= 0"),
        (["placement.actor.gpus_per_node=3"], "does not divide over 3 data-parallel actor ranks"),
        (["placement.vllm.engines=15"], "= 17 GPUs but placement.nodes x placement.gpus_per_node = 16"),
        (["++molt.actor.num_gpus_per_node=4"], "molt.actor.num_gpus_per_node is owned by placement.actor.gpus_per_node"),
        (["algo.reduction=constant_length"], "algo.reduction=constant_length needs algo.constant_length > 0"),
    ],
)
def test_bad_flashreinforce_input_is_refused_before_any_gpu_work(tmp_path, overrides, message):
    with pytest.raises(LaunchError, match=None) as error:
        prepare(tmp_path, "experiment=math_qwen2p5_1p5b", *overrides)
    assert message in str(error.value)
    assert not (tmp_path / "launch").exists()


def test_molt_backend_without_a_model_is_refused(tmp_path):
    with pytest.raises(LaunchError, match="model.name_or_path is not set"):
        prepare(tmp_path, "experiment=tiny", "backend=molt")


def test_grpo_importance_correction_is_refused_too(tmp_path):
    with pytest.raises(LaunchError, match="GRPO baseline has no importance correction"):
        prepare(tmp_path, "experiment=python_tool_qwen2p5_7b", "algo=grpo", "++molt.algo.advantage.is_correction_level=seq")


def test_molt_checks_still_run_on_what_passes_ours(tmp_path):
    # Without importance sampling our top-p check is silent, but the rendered recipe still uses
    # Molt's seq correction level, which Molt's own validation refuses with top-p < 1.
    with pytest.raises(LaunchError, match="Molt rejected the configuration: --rollout.top_p 0.9"):
        prepare(tmp_path, "experiment=math_qwen2p5_1p5b", "algo.importance_sampling=false", "molt.rollout.top_p=0.9")


def test_routing_replay_passes_molts_check_with_the_real_nemo_automodel(tmp_path):
    """Molt's routing-replay check imports nemo_automodel's RouterReplay; the setup installs the
    real package (without its GPU kernels), so the check runs and passes here as on a GPU node."""
    pytest.importorskip("nemo_automodel.components.moe.router_replay")
    variant = ("experiment=moe_lag8_qwen3_30b_a3b", "algo.delta=1e-3", "++molt.train.routing_replay=true",
               "++molt.train.partial_rollout_enable=false", "++molt.rollout.vllm_generate_batch_size=128")
    job = prepare(tmp_path / "dry", *variant)
    assert not any("nemo_automodel" in warning for warning in job.warnings)
    assert "--train.routing_replay" in job.command.argv(missing="x")
    real = prepare(tmp_path / "real", *variant, *present_resources(tmp_path, "moe_lag8_qwen3_30b_a3b"), dry_run=False)
    assert "--train.routing_replay" in real.command.argv()


def test_policy_loss_is_built_in_the_driver(tmp_path):
    # Molt's CLI accepts any --actor.dual_clip; only PolicyLoss (built on the GPU actors) refuses <= 1.
    with pytest.raises(LaunchError, match="dual_clip"):
        prepare(tmp_path, "experiment=python_tool_qwen2p5_7b", "algo=grpo", "++molt.actor.dual_clip=0.5")


def _write_jsonl(path: Path, rows: list) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows))


def test_a_real_launch_refuses_what_a_dry_run_only_warns_about(tmp_path, monkeypatch):
    monkeypatch.delenv("ALFWORLD_DATA", raising=False)
    overrides = ("experiment=alfworld_qwen2p5_7b", f"data.dir={tmp_path / 'data'}", "agent.path=/nonexistent/agent.py")
    job = prepare(tmp_path / "dry", *overrides)
    assert any("ALFWORLD_DATA is unset" in w for w in job.warnings)
    with pytest.raises(LaunchError) as error:
        prepare(tmp_path / "real", *overrides, dry_run=False)
    text = str(error.value)
    for needed in ("data.train=", "data.eval=", "agent file /nonexistent/agent.py (agent.path) does not exist",
                   "environment variable ALFWORLD_DATA is unset"):
        assert needed in text
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path / "missing_games"))
    with pytest.raises(LaunchError, match="ALFWORLD_DATA=.* is not a directory"):
        prepare(tmp_path / "real", *overrides, dry_run=False)


def present_resources(tmp_path: Path, experiment: str) -> tuple[str, ...]:
    """Overrides pointing a real launch at datasets, an agent file and (where the experiment raises
    the model's context) a context-extended model copy that exist; the copy holds only its config."""
    data = tmp_path / "data" / experiment
    row = {"prompt": [{"role": "user", "content": "1+1?"}], "reward_model": {"ground_truth": "2"}}
    _write_jsonl(data / "train.jsonl", [row, row])
    _write_jsonl(data / "eval.jsonl", [row])
    agent = tmp_path / "agent.py"
    agent.write_text("AgentRunner = None\n")
    copy = model_context.extended_copy_path(compose_job(f"experiment={experiment}", f"model.dir={tmp_path / 'models'}"))
    if copy is not None:
        copy.mkdir(parents=True, exist_ok=True)
        positions = int(copy.name.rsplit("-ctx", 1)[1])
        (copy / "config.json").write_text(json.dumps({"max_position_embeddings": positions}))
    return f"data.dir={tmp_path / 'data'}", f"agent.path={agent}", f"model.dir={tmp_path / 'models'}"


def test_a_real_launch_with_everything_present_passes(tmp_path):
    job = prepare(tmp_path / "run", "experiment=math_qwen2p5_1p5b", *present_resources(tmp_path, "math_qwen2p5_1p5b"),
                  dry_run=False)
    assert job.warnings == []
    args = parse_and_validate(job.command.argv())
    assert args.data.prompt_dataset == str(tmp_path / "data" / "math_qwen2p5_1p5b" / "train.jsonl")


@pytest.mark.parametrize(
    "rows, message",
    [
        (['{"prompt": "x", "reward_model": {}}', "{not json"], "line 2 is not JSON"),
        ([{"question": "x", "reward_model": {}}], "line 1 lacks the field(s) ['prompt', 'reward_model']"),
        ([], "is empty"),
    ],
)
def test_malformed_datasets_are_errors_even_in_a_dry_run(tmp_path, rows, message):
    _write_jsonl(tmp_path / "data" / "math_qwen2p5_1p5b" / "train.jsonl", rows)
    with pytest.raises(LaunchError, match=None) as error:
        prepare(tmp_path / "run", "experiment=math_qwen2p5_1p5b", f"data.dir={tmp_path / 'data'}")
    assert "data.train=" in str(error.value) and message in str(error.value)


def test_a_dataset_path_with_a_comma_is_refused_before_molt_splits_it_in_two(tmp_path):
    # Molt reads --data.prompt_dataset as a comma-separated list: a sweep job directory such as
    # `0_algo=grpo,algo.delta=...` holding a rehearsal's data would become two datasets that do not exist.
    data = tmp_path / "0_a=1,b=2" / "data"
    _write_jsonl(data / "math_qwen2p5_1p5b" / "train.jsonl", [{"prompt": "x", "reward_model": {}}])
    with pytest.raises(LaunchError) as error:
        prepare(tmp_path / "run", "experiment=math_qwen2p5_1p5b", f"data.dir='{data}'")
    assert str(error.value).startswith(f"data.train={data / 'math_qwen2p5_1p5b' / 'train.jsonl'} holds a comma")
    assert "hydra.sweep.subdir=${hydra.job.num}" in str(error.value)


def test_modes_and_cluster_settings_stay_out_of_sweep_job_names():
    from hydra import compose, initialize_config_module

    with initialize_config_module(config_module="molt_flashreinforce.conf", version_base="1.3"):
        cfg = compose(config_name="config", overrides=["experiment=math_qwen2p5_1p5b"], return_hydra_config=True)
    excluded = set(cfg.hydra.job.config.override_dirname.exclude_keys)
    assert {"rehearsal", "cluster.ray_port", "cluster.join_timeout_s", "dry_run"} <= excluded
