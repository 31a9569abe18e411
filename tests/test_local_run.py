"""`molt_flashreinforce.local.run` end to end on a very small config: TensorBoard tags (Molt's
names from metrics.py), checkpoints, bit-exact resume, config errors, and the tiny experiment's
composition through Hydra."""

from __future__ import annotations

import json

import pytest
import torch
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from molt_flashreinforce import metrics as tags
from molt_flashreinforce.local import run
from molt_flashreinforce.local.config import LocalConfig, LocalConfigError
from molt_flashreinforce.report.events import read_scalars


def _cfg(steps=6, algo=None, **local):
    node = dict(
        steps=steps, rollouts_per_step=16, policy_lag=2, lr=3e-3, progress_bar=False,
        task={"max_operand": 9, "eval_size": 10},
        model={"n_layer": 1, "n_embd": 32, "n_head": 2},
        warm_start={"steps": 20, "batch_size": 32, "lr": 1e-2},
        eval={"every": 3}, checkpoint={"every": 2, "keep_last": 2},
    )
    node.update(local)
    algo = algo or {"name": "flashreinforce", "group_size": 1, "delta": 3e-3, "gate_level": "sequence",
                    "gate_mean": "arithmetic", "reduction": "sample_mean", "constant_length": None,
                    "importance_sampling": True, "entropy_filter_q": 1.0}
    return OmegaConf.create({"backend": "local", "seed": 3, "algo": algo, "local": node})


def test_run_writes_molt_metric_names_checkpoints_and_a_summary(tmp_path):
    summary = run(_cfg(), tmp_path)
    scalars = read_scalars(tmp_path)
    train_tags = {tags.REWARD_MEAN, tags.REWARD_STD, tags.ROLLOUT_PASS1, tags.NUM_ROLLOUTS,
                  tags.RESPONSE_LENGTH_MEAN, tags.TRUNCATED_RATE, tags.POLICY_LOSS, tags.ADVANTAGE_MEAN,
                  tags.ACTOR_LR, tags.ACTOR_GRAD_NORM, tags.VLLM_KL, tags.IS_FILTER_RATIO, tags.ACCEPTANCE_RATE,
                  tags.SEQUENCE_KL_MEAN, tags.RETAINED_TOKEN_FRACTION, tags.POLICY_LAG_MEAN, tags.POLICY_LAG_MAX,
                  tags.STEP_TIME}
    for tag in train_tags:
        assert [step for step, _ in scalars[tag]] == list(range(1, 7)), tag
    assert [v for _, v in scalars[tags.POLICY_LAG_MAX]] == [0, 1, 2, 2, 2, 2]
    assert scalars[tags.ROLLOUTS_CONSUMED] == tuple((s, 16.0 * s) for s in range(7))
    for counter in (tags.GENERATED_TOKENS, tags.TRAINED_TOKENS):
        assert [s for s, _ in scalars[counter]] == list(range(7)) and scalars[counter][0][1] == 0.0
    assert sum(t for _, t in scalars[tags.STEP_TIME]) <= summary["rl_wall_s"]  # evals and checkpoints excluded
    assert [s for s, _ in scalars["eval/eval_tiny_pass1"]] == [0, 3, 6]
    assert {v for _, v in scalars[tags.NUM_ROLLOUTS]} == {16.0}
    for _, rate in scalars[tags.ACCEPTANCE_RATE]:
        assert 0.0 <= rate <= 1.0
    assert (tmp_path / "tensorboard").is_dir()

    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_000004.pt", "step_000006.pt"]
    assert summary["updates"] == 6 and summary["rollouts_consumed"] == 96
    assert summary["eval_pass1_end"] == scalars["eval/eval_tiny_pass1"][-1][1]
    assert summary["loss_path"] == "MoltObjective"
    assert json.loads((tmp_path / "summary.json").read_text())["checkpoint"].endswith("step_000006.pt")


def test_resume_continues_bit_for_bit(tmp_path):
    straight = run(_cfg(steps=6), tmp_path / "straight")
    run(_cfg(steps=3), tmp_path / "resumed")  # stops after update 3, mid-way between checkpoint cadences
    resumed = run(_cfg(steps=6), tmp_path / "resumed")
    a = torch.load(tmp_path / "straight/checkpoints/step_000006.pt", weights_only=False)["trainer"]
    b = torch.load(tmp_path / "resumed/checkpoints/step_000006.pt", weights_only=False)["trainer"]
    for key in a["policy"]:
        assert torch.equal(a["policy"][key], b["policy"][key]), key
    assert [tuple(x) for x in straight["eval_history"]] == [tuple(x) for x in resumed["eval_history"]]
    straight_scalars, resumed_scalars = read_scalars(tmp_path / "straight"), read_scalars(tmp_path / "resumed")
    assert straight_scalars[tags.REWARD_MEAN] == resumed_scalars[tags.REWARD_MEAN]
    # The token counters continue across the resume instead of restarting at 0.
    for counter in (tags.GENERATED_TOKENS, tags.TRAINED_TOKENS):
        assert straight_scalars[counter] == resumed_scalars[counter], counter
        assert a[counter.removeprefix("train/")] == b[counter.removeprefix("train/")] == straight_scalars[counter][-1][1]
    assert (straight["generated_tokens"], straight["trained_tokens"]) == (resumed["generated_tokens"], resumed["trained_tokens"])


def test_a_cached_warm_start_gives_the_same_run_and_is_keyed_by_what_it_depends_on(tmp_path, capsys):
    cache = str(tmp_path / "warm_starts")
    uncached = run(_cfg(steps=4), tmp_path / "uncached")
    first = run(_cfg(steps=4, warm_start={"steps": 20, "batch_size": 32, "lr": 1e-2, "cache_dir": cache}),
                tmp_path / "first")
    assert "supervised steps in" in capsys.readouterr().out  # the first run computes and stores it
    second = run(_cfg(steps=4, warm_start={"steps": 20, "batch_size": 32, "lr": 1e-2, "cache_dir": cache}),
                 tmp_path / "second")
    assert "Warm start: loaded from" in capsys.readouterr().out
    for summary in (first, second):
        assert [tuple(x) for x in summary["eval_history"]] == [tuple(x) for x in uncached["eval_history"]]
        assert summary["warm_start_loss"] == uncached["warm_start_loss"]
    a = torch.load(tmp_path / "uncached/checkpoints/step_000004.pt", weights_only=False)["trainer"]
    b = torch.load(tmp_path / "second/checkpoints/step_000004.pt", weights_only=False)["trainer"]
    for key in a["policy"]:
        assert torch.equal(a["policy"][key], b["policy"][key]), key
    assert torch.equal(a["prompt_generator"], b["prompt_generator"])
    # Another warm-start schedule, and another seed, are other entries.
    run(_cfg(steps=1, warm_start={"steps": 10, "batch_size": 32, "lr": 1e-2, "cache_dir": cache}), tmp_path / "other")
    assert "supervised steps in" in capsys.readouterr().out
    assert len(list((tmp_path / "warm_starts").glob("seed3_*.pt"))) == 2


def test_warm_start_stops_at_its_target_without_changing_the_steps_it_took():
    from molt_flashreinforce.local.trainer import LocalTrainer

    def warm(**spec):
        cfg = _cfg(task={"max_operand": 9, "eval_size": 40},
                   warm_start={"steps": 60, "batch_size": 32, "lr": 1e-2, "check_every": 5, "check_size": 64, **spec})
        trainer = LocalTrainer(LocalConfig.from_node(cfg.local), cfg.algo, 3)
        return trainer, trainer.warm_start()

    _, (_, never) = warm(target_pass1=1.0)
    assert never == 60  # an unreachable target runs every step
    stopped, (_, taken) = warm(target_pass1=0.05)
    assert 0 < taken < 60 and taken % 5 == 0
    # The checks draw from their own generators: stopping there equals a plain warm start of that length.
    plain, _ = warm(steps=taken)
    for key, value in plain.policy.state_dict().items():
        assert torch.equal(value, stopped.policy.state_dict()[key]), key
    assert torch.equal(plain.prompt_generator.get_state(), stopped.prompt_generator.get_state())
    assert torch.equal(plain.sample_generator.get_state(), stopped.sample_generator.get_state())
    with pytest.raises(LocalConfigError, match=r"local.warm_start.target_pass1=1.5 must be in \(0, 1\]"):
        LocalConfig.from_node({"warm_start": {"target_pass1": 1.5}})


def test_eval_sampling_seed_measures_noise_without_changing_the_default_eval(tmp_path):
    from molt_flashreinforce.local.trainer import LocalTrainer

    cfg = _cfg(task={"max_operand": 9, "eval_size": 40})
    trainer = LocalTrainer(LocalConfig.from_node(cfg.local), cfg.algo, 3)
    trainer.warm_start()
    default = trainer.evaluate()
    assert trainer.evaluate() == default == trainer.evaluate(sampling_seed=trainer.cfg.task.eval_seed)
    others = {trainer.evaluate(sampling_seed=s)["eval/eval_tiny_pass1"] for s in range(8)}
    assert len(others) > 1  # other sampling seeds draw other samples of the same policy


def test_resume_refuses_changed_settings(tmp_path):
    run(_cfg(steps=2), tmp_path)
    with pytest.raises(ValueError, match="different settings.*policy_lag"):
        run(_cfg(steps=4, policy_lag=5), tmp_path)


def test_grpo_runs_on_the_same_harness(tmp_path):
    summary = run(_cfg(steps=2, algo={"name": "grpo", "group_size": 4, "clip_eps": 0.2}), tmp_path)
    scalars = read_scalars(tmp_path)
    assert summary["rollouts_consumed"] == 32 and tags.ACCEPTANCE_RATE not in scalars


def test_config_errors_name_the_key_and_the_fix():
    with pytest.raises(LocalConfigError, match="experiment=tiny"):
        LocalConfig.from_node(None)
    with pytest.raises(LocalConfigError, match=r"local\.model\.n_layers"):
        LocalConfig.from_node({"model": {"n_layers": 2}})
    with pytest.raises(LocalConfigError, match=r"local\.policy_lag=-1 must be an integer >= 0"):
        LocalConfig.from_node({"policy_lag": -1})
    with pytest.raises(LocalConfigError, match="multiple of algo.group_size"):
        run(_cfg(rollouts_per_step=6, algo={"name": "grpo", "group_size": 4}), "unused")


def test_tiny_experiment_composes_to_a_valid_local_backend():
    with initialize_config_module("molt_flashreinforce.conf", version_base="1.3"):
        cfg = compose("config", overrides=["experiment=tiny", "algo=grpo", "local.policy_lag=8"])
    assert cfg.backend == "local" and cfg.algo.name == "grpo" and cfg.algo.group_size == 4
    local = LocalConfig.from_node(cfg.local)
    assert local.policy_lag == 8 and local.task.datasource == "tiny"
    assert local.rollouts_per_step % cfg.algo.group_size == 0


def test_without_molt_flashreinforce_falls_back_to_the_torch_objective(tmp_path, monkeypatch):
    """Molt is installed here; hiding it exercises the path of a machine without it."""
    monkeypatch.setattr("molt_flashreinforce.local.objective.molt_available", lambda: False)
    summary = run(_cfg(steps=2), tmp_path)
    assert summary["loss_path"] == "TorchFlashReinforce"
    assert tags.ACCEPTANCE_RATE in read_scalars(tmp_path)


def test_sigusr2_checkpoints_the_update_under_way_and_training_goes_on(tmp_path, monkeypatch, capsys):
    """SLURM's `--signal=USR2@900` before the time limit: the CPU backend keeps the update under way
    in a checkpoint instead of dying (SIGUSR2's default action), and finishes if time allows."""
    import os
    import signal

    from molt_flashreinforce.local.trainer import LocalTrainer

    step = LocalTrainer.step

    def step_then_warned(self):
        logged = step(self)
        if self.version == 1:
            os.kill(os.getpid(), signal.SIGUSR2)
        return logged

    monkeypatch.setattr(LocalTrainer, "step", step_then_warned)
    summary = run(_cfg(steps=3, checkpoint={"every": 10, "keep_last": 5}), tmp_path)
    assert summary["updates"] == 3
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_000001.pt", "step_000003.pt"]
    assert f"time limit near (SIGUSR2): checkpoint at update 1; rerun in {tmp_path} to resume" in capsys.readouterr().out
    assert signal.getsignal(signal.SIGUSR2) == signal.SIG_DFL  # the handler is the run's alone
