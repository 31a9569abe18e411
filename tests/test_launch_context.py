"""The model's context against molt.data.max_len, checked before any GPU work (issue 11, item 2).

Qwen2.5-Math-1.5B publishes 4,096 positions and the paper's setting needs 6,144: the math
experiment renders a copy of the model whose config.json allows 6,144. No model is downloaded:
the local models here are directories holding only a config.json and a tokenizer stand-in file.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hydra import compose, initialize_config_module

from molt_flashreinforce.launch import checks, model_context
from molt_flashreinforce.launch.errors import LaunchError
from molt_flashreinforce.launch.job import prepare_molt_job
from molt_flashreinforce.launch.molt_cli import parse_and_validate


def compose_job(*overrides: str):
    with initialize_config_module(config_module="molt_flashreinforce.conf", version_base="1.3"):
        return compose(config_name="config", overrides=["dry_run=true", *overrides])


def local_model(root: Path, positions: int) -> Path:
    root.mkdir(parents=True)
    (root / "config.json").write_text(json.dumps({"model_type": "qwen2", "max_position_embeddings": positions,
                                                  "rope_theta": 10000.0}))
    (root / "tokenizer.json").write_text("{}")
    return root


def test_math_experiment_renders_the_extended_copy_and_lists_it_as_missing(tmp_path):
    cfg = compose_job("experiment=math_qwen2p5_1p5b", f"model.dir={tmp_path / 'models'}")
    job = prepare_molt_job(cfg, tmp_path / "run")
    args = parse_and_validate(job.command.argv(missing="x"))
    assert args.actor.model_name_or_path == str(tmp_path / "models" / "Qwen2.5-Math-1.5B-ctx6144")
    assert args.data.max_len == 6144
    assert any("python -m molt_flashreinforce.launch.model_context Qwen/Qwen2.5-Math-1.5B "
               "--max-position-embeddings 6144" in warning for warning in job.warnings)


def test_without_the_override_the_math_context_is_refused_in_one_line():
    cfg = compose_job("experiment=math_qwen2p5_1p5b", "model.max_position_embeddings=null")
    with pytest.raises(LaunchError) as error:
        checks.check_config(cfg)
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith("molt.data.max_len=6144 exceeds the model's context of 4096 positions "
                              "(the shape card of Qwen/Qwen2.5-Math-1.5B)")
    assert "set model.max_position_embeddings=6144" in message


def test_the_models_own_config_json_wins_over_the_shape_card(tmp_path):
    model = local_model(tmp_path / "Qwen2.5-Math-1.5B", 2048)
    assert model_context.native_max_positions(str(model)) == (2048, f"{model}'s config.json")
    assert model_context.native_max_positions("Qwen/Qwen2.5-Math-1.5B")[0] == 4096  # shape card
    assert model_context.native_max_positions("no-such/model") == (None, "no readable config.json or shape card "
                                                                          "for no-such/model")
    cfg = compose_job("experiment=math_qwen2p5_1p5b", f"model.name_or_path={model}",
                      "model.max_position_embeddings=null", "molt.data.max_len=4096")
    with pytest.raises(LaunchError, match=r"molt.data.max_len=4096 exceeds the model's context of 2048 positions "
                                          r"\(.*config.json\)"):
        checks.check_config(cfg)


def test_extended_copy_links_every_file_and_raises_only_the_context(tmp_path):
    source = local_model(tmp_path / "src" / "Qwen2.5-Math-1.5B", 4096)
    copy = model_context.write_extended_copy(str(source), 6144, tmp_path / "models" / "Qwen2.5-Math-1.5B-ctx6144")
    assert json.loads((copy / "config.json").read_text()) == {"model_type": "qwen2", "max_position_embeddings": 6144,
                                                              "rope_theta": 10000.0}
    assert (copy / "tokenizer.json").resolve() == (source / "tokenizer.json").resolve()
    assert json.loads((source / "config.json").read_text())["max_position_embeddings"] == 4096
    with pytest.raises(ValueError, match="below"):
        model_context.write_extended_copy(str(source), 2048, tmp_path / "smaller")

    # Once written, the check reads the copy itself and the launch no longer lists it as missing.
    cfg = compose_job("experiment=math_qwen2p5_1p5b", f"model.name_or_path={source}", f"model.dir={tmp_path / 'models'}")
    assert checks.model_max_positions(cfg) == (6144, f"{copy}/config.json")
    checks.check_config(cfg)
    assert not [p for p in checks.missing_resources(cfg, None, model_context.extended_copy_path(cfg)) if "model_context" in p]


def test_an_override_below_the_models_context_is_refused():
    cfg = compose_job("experiment=python_tool_qwen2p5_7b", "model.max_position_embeddings=4096")
    with pytest.raises(LaunchError, match=r"model.max_position_embeddings=4096 is below 32768"):
        checks.check_config(cfg)


def test_check_context_accepts_an_unknown_model_and_a_fitting_length():
    cfg = compose_job("experiment=long_horizon_r1_distill_1p5b")
    checks.check_context(cfg, None)
    checks.check_context(cfg, 9216)
    with pytest.raises(LaunchError, match=r"molt.data.max_len=9216 exceeds the model's context of 9215 positions"):
        checks.check_context(cfg, 9215, "a test")


def test_moe_experiment_exports_thinking_disabled_to_every_worker(tmp_path):
    job = prepare_molt_job(compose_job("experiment=moe_lag8_qwen3_30b_a3b"), tmp_path)
    assert job.command.env["ENABLE_THINKING"] == "false"
    assert "ENABLE_THINKING" in job.command.env["MOLT_FLASHREINFORCE_WORKER_ENV"].split(",")
    python_tool = prepare_molt_job(compose_job("experiment=python_tool_qwen2p5_7b"), tmp_path / "tool")
    assert "ENABLE_THINKING" not in python_tool.command.env


def test_thinking_switch_on_an_agent_that_ignores_it_is_refused():
    with pytest.raises(LaunchError, match="agent.enable_thinking=False: the shipped alfworld agent ignores it"):
        checks.check_config(compose_job("experiment=alfworld_qwen2p5_7b", "agent.enable_thinking=false"))
    # An agent file of one's own gets ENABLE_THINKING exported and may read it.
    checks.check_config(compose_job("experiment=moe_lag8_qwen3_30b_a3b", "agent.path=my_agent.py"))


def test_config_json_is_read_from_the_hugging_face_cache_offline(tmp_path, monkeypatch):
    import huggingface_hub.constants

    snapshot = tmp_path / "models--Qwen--Qwen2.5-Math-1.5B" / "snapshots" / ("a" * 40)
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps({"max_position_embeddings": 3000}))
    (tmp_path / "models--Qwen--Qwen2.5-Math-1.5B" / "refs").mkdir()
    (tmp_path / "models--Qwen--Qwen2.5-Math-1.5B" / "refs" / "main").write_text("a" * 40)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    assert model_context.native_max_positions("Qwen/Qwen2.5-Math-1.5B") == (
        3000, "Qwen/Qwen2.5-Math-1.5B's config.json")
