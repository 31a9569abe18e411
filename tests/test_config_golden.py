"""Golden `--cfg job` snapshots of every paper experiment x algo (tests/golden/).

A config change shows up here as a diff to review. After an intended change, regenerate them from
the real command line with:

    UPDATE_GOLDEN=1 pytest tests/test_config_golden.py
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from molt_flashreinforce import conf

GOLDEN = Path(__file__).parent / "golden"
EXPERIMENTS = tuple(conf.paper_experiments())
CASES = [(experiment, algo) for experiment in EXPERIMENTS for algo in ("flashreinforce", "grpo")]


def cli_cfg_job(experiment: str, algo: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "molt_flashreinforce", f"experiment={experiment}", f"algo={algo}", "--cfg", "job"],
        capture_output=True, text=True, check=True,
    )
    return done.stdout


def golden_path(experiment: str, algo: str) -> Path:
    return GOLDEN / f"{experiment}__{algo}.yaml"


@pytest.mark.skipif(not os.environ.get("UPDATE_GOLDEN"), reason="set UPDATE_GOLDEN=1 to regenerate the snapshots")
def test_regenerate_golden_snapshots():
    GOLDEN.mkdir(exist_ok=True)
    for experiment, algo in CASES:
        golden_path(experiment, algo).write_text(cli_cfg_job(experiment, algo))


@pytest.mark.parametrize("experiment, algo", CASES)
def test_composed_job_config_matches_golden(experiment, algo):
    with initialize_config_module(config_module="molt_flashreinforce.conf", version_base="1.3"):
        cfg = compose(config_name="config", overrides=[f"experiment={experiment}", f"algo={algo}"])
    assert OmegaConf.to_yaml(cfg) == golden_path(experiment, algo).read_text()


def test_command_line_cfg_job_is_what_the_snapshot_holds():
    assert cli_cfg_job("alfworld_qwen2p5_7b", "grpo") == golden_path("alfworld_qwen2p5_7b", "grpo").read_text()
