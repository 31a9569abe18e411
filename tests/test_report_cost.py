"""The report's cost columns: wall-clock, GPU-hours, generated and trained tokens by the step used.

Molt-style run directories get the run record our launcher writes (`launch.records.write_records`
on the composed config) and TensorBoard events under the tag names Molt itself logs, found in
molt-rl 0.2.1's source (checked against the installed copy in the first test):
- `train/timing/step_total`: molt/trainer/rl_trainer.py:912, `status["timing/step_total"]`;
- `train/rollout/response_length_mean` and `train/rollout/num_samples`: rl_trainer.py:378 and :380;
- `train/total_length`: molt/trainer/workers/policy_actor.py:663-669 logs every episode field of
  `Experience` (experience.py:112 `total_length`) as a sample-weighted metric;
- the `train/` prefix: molt/utils/logging_utils.py:147, `add_scalar(f"train/{k}", ...)`.
The local run is a real, very short training run through the launcher's own entry point.
Expected values are worked out by hand from the scalars each test writes.
"""

from __future__ import annotations

import csv
import importlib.util
import io
import json
from pathlib import Path

import pytest
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf
from torch.utils.tensorboard import SummaryWriter

from molt_flashreinforce import metrics
from molt_flashreinforce.app import dispatch
from molt_flashreinforce.launch.records import write_records
from molt_flashreinforce.report.cli import main
from molt_flashreinforce.report.events import read_scalars
from molt_flashreinforce.report.placement import read_placement

TOOL_TASKS = ("amc23", "minerva", "aime25")


def compose_config(*overrides: str):
    with initialize_config_module(config_module="molt_flashreinforce.conf", version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


def recorded_run(run_dir: Path, *overrides: str) -> Path:
    """A run directory with the launcher's run record and, as Hydra keeps it, the config."""
    config = compose_config(*overrides)
    write_records(run_dir, config, command=None, warnings=[])
    (run_dir / ".hydra").mkdir()
    (run_dir / ".hydra" / "config.yaml").write_text(OmegaConf.to_yaml(config, resolve=True))
    return run_dir


def write_events(run_dir: Path, scalars: dict[str, dict[int, float]]) -> None:
    writer = SummaryWriter(log_dir=str(run_dir / "tensorboard" / "run"))  # Molt: <tensorboard_dir>/<run_name>/
    for tag, by_step in scalars.items():
        for step, value in by_step.items():
            writer.add_scalar(tag, value, step)
    writer.close()


def report_csv(capsys, *args) -> list[dict[str, str]]:
    assert main([str(arg) for arg in args] + ["--format", "csv", "--view", "compare"]) == 0
    return list(csv.DictReader(io.StringIO(capsys.readouterr().out)))


def row(rows: list[dict[str, str]], row_id: str) -> dict[str, str]:
    (found,) = [r for r in rows if r["row"] == row_id]
    return found


def molt_source(relative: str) -> str:
    (package_dir,) = importlib.util.find_spec("molt").submodule_search_locations
    return (Path(package_dir) / relative).read_text()


def test_the_tag_names_are_the_ones_molt_logs():
    trainer = molt_source("trainer/rl_trainer.py")
    assert f'status["{metrics.STEP_TIME.removeprefix("train/")}"]' in trainer
    for tag in (metrics.RESPONSE_LENGTH_MEAN, metrics.NUM_SAMPLES):
        assert f'"{tag.removeprefix("train/")}":' in trainer
    assert f'{metrics.TOTAL_LENGTH_MEAN.removeprefix("train/")}: torch.Tensor = tensor_field("episode"' in \
        molt_source("trainer/algorithm/experience.py")
    assert "Experience.is_episode_tensor_field(f.name)" in molt_source("trainer/workers/policy_actor.py")
    assert 'add_scalar(f"train/{k}", v, global_step)' in molt_source("utils/logging_utils.py")


@pytest.mark.parametrize("experiment", ["math_qwen2p5_1p5b", "python_tool_qwen2p5_7b", "moe_lag8_qwen3_30b_a3b",
                                        "alfworld_qwen2p5_7b", "long_horizon_r1_distill_1p5b"])
def test_every_shipped_placement_holds_its_whole_cluster(tmp_path, experiment):
    config = compose_config(f"experiment={experiment}")
    placement = read_placement(recorded_run(tmp_path, f"experiment={experiment}"))
    assert placement.gpus == config.placement.nodes * config.placement.gpus_per_node
    actor = config.placement.actor
    assert placement.dp_ranks == actor.nodes * actor.gpus_per_node // (actor.tp * actor.cp)


def test_placement_counts_vllm_pipeline_and_data_parallel_and_not_a_cpu_rehearsal(tmp_path):
    # gpu16_actor8_vllm4tp2: 8 actor GPUs + 4 engines x TP2, here also x PP2 x DP3.
    overrides = ("experiment=python_tool_qwen2p5_7b", "+molt.vllm.pipeline_parallel_size=2",
                 "+molt.vllm.data_parallel_size=3")
    assert read_placement(recorded_run(tmp_path / "pp", *overrides)).gpus == 8 + 4 * 2 * 2 * 3
    rehearsal = read_placement(recorded_run(tmp_path / "rehearsal", "experiment=python_tool_qwen2p5_7b", "rehearsal=cpu"))
    assert rehearsal.gpus is None and "CPU rehearsal" in rehearsal.missing and rehearsal.dp_ranks == 8
    assert read_placement(tmp_path / "no_record").missing == "no run record launch/config.yaml"


def molt_scalars() -> dict[str, dict[int, float]]:
    """Four steps of a python-tool GRPO run: evals at steps 2 (best) and 4; 131 samples per step,
    so balance_experiences keeps 128 for the 8 data-parallel ranks (131 % 8 = 3 dropped)."""
    scalars = {metrics.eval_pass1(task): {2: 0.6, 4: 0.3} for task in TOOL_TASKS}
    scalars[metrics.TOOL_CALLS] = {4: 0.0}
    scalars[metrics.ROLLOUTS_CONSUMED] = {step: 128.0 * step for step in range(1, 5)}
    scalars[metrics.STEP_TIME] = {1: 90.0, 2: 110.0, 3: 120.0, 4: 80.0}
    scalars[metrics.RESPONSE_LENGTH_MEAN] = {1: 500.0, 2: 600.0, 3: 700.0, 4: 400.0}
    scalars[metrics.NUM_SAMPLES] = {step: 131.0 for step in range(1, 5)}
    scalars[metrics.TOTAL_LENGTH_MEAN] = {1: 900.0, 2: 1000.0, 3: 1100.0, 4: 800.0}
    return scalars


def test_molt_run_gpu_hours_are_placement_times_summed_step_time(tmp_path, capsys):
    run = recorded_run(tmp_path / "run", "experiment=python_tool_qwen2p5_7b", "algo=grpo")
    write_events(run, molt_scalars())
    rows = report_csv(capsys, run)
    final, best = row(rows, "score_600"), row(rows, "score_peak")
    assert (final["step_used"], best["step_used"]) == ("4", "2")
    assert final["gpus"] == "16"  # gpu16_actor8_vllm4tp2: 1 x 8 actor GPUs + 4 vLLM engines x TP2
    assert float(final["wall_s"]) == 90 + 110 + 120 + 80 == 400
    assert float(final["gpu_hours"]) == pytest.approx(16 * 400 / 3600)
    assert float(final["generated_tokens"]) == 131 * (500 + 600 + 700 + 400) == 288_200
    assert float(final["trained_tokens"]) == 128 * (900 + 1000 + 1100 + 800) == 486_400
    # The best eval is at step 2: its cost is what the run had spent by then.
    assert float(best["gpu_hours"]) == pytest.approx(16 * (90 + 110) / 3600)
    assert (float(best["generated_tokens"]), float(best["trained_tokens"])) == (131 * 1100, 128 * 1900)
    assert final["cost_status"] == best["cost_status"] == ""

    assert main([str(run)]) == 0
    out = capsys.readouterr().out
    assert "| step 600 | 4 | 512 | 6 min 40 s | 1.78 | 288,200 | 486,400 | 30.3 | 30.0 | -0.3 |" in out
    assert "| best eval | 2 | 256 | 3 min 20 s | 0.89 | 144,100 | 243,200 |" in out
    assert "GPUs held: 16 GPUs (actor 1 node(s) x 8, vLLM 4 engines x 2)" in out and "cost n/a" not in out


def test_molt_run_cost_is_na_when_molt_skipped_steps_or_the_record_is_missing(tmp_path, capsys):
    scalars = molt_scalars()
    scalars[metrics.STEP_TIME] = {2: 200.0, 4: 200.0}  # logger.logging_steps=2
    write_events(tmp_path / "bare", scalars)  # no run record either
    rows = report_csv(capsys, tmp_path / "bare", "--experiment", "python_tool_qwen2p5_7b")
    final = row(rows, "score_600")
    assert final["wall_s"] == final["gpu_hours"] == final["trained_tokens"] == final["gpus"] == ""
    assert float(final["generated_tokens"]) == 288_200  # needs neither the step times nor the record
    assert "wall-clock: train/timing/step_total not logged at 2 of steps 1-4 (first: 1)" in final["cost_status"]
    assert "GPU-hours: needs the wall-clock" in final["cost_status"]
    assert "trained tokens: no train/trained_tokens, and no data-parallel rank count" in final["cost_status"]


LOCAL_SHORT = ["experiment=tiny", "local.steps=4", "local.warm_start.steps=5", "local.eval.every=2",
               "local.rollouts_per_step=16", "local.task.eval_size=32", "local.checkpoint.every=4",
               "local.progress_bar=false"]
TINY_PROMPT_TOKENS = 7  # `<bos> a + b =` with two-digit operands (max_operand 99)


def test_local_run_reports_cpu_wall_clock_and_its_token_counters(tmp_path, capsys):
    run = tmp_path / "run"
    dispatch.run(compose_config(*LOCAL_SHORT), run)  # what `molt-flashreinforce experiment=tiny ...` runs
    scalars = read_scalars(run)
    summary = json.loads((run / "summary.json").read_text())
    capsys.readouterr()  # the run's own output

    rows = report_csv(capsys, run, "--experiment", "tiny")
    final = row(rows, "final")
    assert final["step_used"] == "4"
    # Independent of the counters: each update's mean response length x its 16 trajectories.
    generated = sum(mean * 16 for step, mean in scalars[metrics.RESPONSE_LENGTH_MEAN] if step <= 4)
    assert float(final["generated_tokens"]) == generated == summary["generated_tokens"]
    assert float(final["trained_tokens"]) == generated + 4 * 16 * TINY_PROMPT_TOKENS == summary["trained_tokens"]
    step_times = [seconds for _, seconds in scalars[metrics.STEP_TIME]]
    assert len(step_times) == 4 and float(final["wall_s"]) == pytest.approx(sum(step_times))
    assert 0 < float(final["wall_s"]) <= summary["rl_wall_s"]
    assert final["gpus"] == final["gpu_hours"] == ""
    assert final["cost_status"] == "GPU-hours: a CPU run (local.device=cpu)"

    assert main([str(run), "--experiment", "tiny", "--view", "compare"]) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if "| final |" in line)
    cells = [cell.strip() for cell in line.strip("|").split("|")]
    assert cells[5].endswith(" s") and cells[6] == "n/a" and cells[7] == f"{generated:,.0f}"
