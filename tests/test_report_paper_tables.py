"""From the data command's output to a filled paper table, for each of the five paper experiments.

Each test runs `molt-flashreinforce-data` in process (`data.cli.main`) on fixture rows that have
the real datasets' schemas and field values (tests/fixtures/data; ALFWorld: real TextWorld games
written as the rehearsal writes them). The eval rows it wrote then go through Molt's own
`compute_eval_metrics` (which names each score after the rows' `datasource`) and Molt's own
`TensorboardLogger` (which prefixes `eval/` and `train/`), at the protocol's eval steps, so no
tag name is written by this file. The run directory holds the launcher's records of the real
experiment config (`launch/config.yaml`, `.hydra/config.yaml`). `molt-flashreinforce-report`
must then fill every line of the paper's table that the run covers with the value worked out by
hand from the rewards written (`score`), name the strict grader and the eval protocol of the
experiment's config, and cost it from the placement's GPUs.

Only what cannot run here is stood in for: no model generates; each eval sample's reward is set.
"""

from __future__ import annotations

import csv
import importlib.util
import io
import json
import math
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf
from torch.utils.tensorboard import SummaryWriter

VLLM_STUB = Path(__file__).parents[1] / "molt_flashreinforce" / "rehearsal" / "vllm_standin"  # SamplingParams only
if importlib.util.find_spec("vllm") is None:
    sys.path.insert(0, str(VLLM_STUB))

from molt.trainer.rl_trainer import compute_eval_metrics  # noqa: E402
from molt.utils.logging_utils import TensorboardLogger  # noqa: E402

from molt_flashreinforce import metrics  # noqa: E402
from molt_flashreinforce.data.cli import main as data_command  # noqa: E402
from molt_flashreinforce.eval_record import (BenchmarkScore, EvalRecord, ModelRef, Protocol,  # noqa: E402
                                             write_record)
from molt_flashreinforce.launch.records import write_records  # noqa: E402
from molt_flashreinforce.rehearsal.alfworld_games import rehearsal_games, write_games  # noqa: E402
from molt_flashreinforce.report.cli import main as report  # noqa: E402

FIXTURES = Path(__file__).parent / "fixtures" / "data"
MATH_SOURCES = {"dapo": "dapo.jsonl", "math500": "math500.parquet", "amc23": "amc23.json", "minerva": "minerva.jsonl",
                "aime25": "aime25.jsonl", "olympiadbench": "olympiadbench.jsonl"}
SAMPLES = 2  # eval samples per problem (avg@2): enough to exercise Molt's mean over samples
STEP_SECONDS = 30.0  # every step's train/timing/step_total


def compose_config(*overrides: str):
    with initialize_config_module(config_module="molt_flashreinforce.conf", version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


def prepare(experiment: str, out: Path, sources: dict[str, str], capsys) -> list[dict]:
    argv = [experiment, "--out", str(out)] + [arg for name, path in sources.items() for arg in ("--source", f"{name}={path}")]
    assert data_command(argv) == 0, capsys.readouterr().err
    capsys.readouterr()
    return [json.loads(line) for line in (out / experiment / "eval.jsonl").read_text().splitlines()]


def datasources(rows: list[dict]) -> list[str]:
    return list(dict.fromkeys(row["datasource"] for row in rows))


def score(index: int, step: int, slope: float) -> float:
    """The avg@k written for the index-th datasource at `step`."""
    return 0.2 + 0.04 * index + slope * step


def eval_logs(rows: list[dict], step: int, slope: float) -> dict[str, float]:
    """Molt's eval metrics for one eval of `rows`: problem j of a datasource (n problems) gets samples
    whose rewards average to score + 0.02 (j - (n-1)/2), so the datasource's mean is `score`."""
    loader = [([row["datasource"] for row in rows], [row["prompt"] for row in rows], [None] * len(rows),
               [None] * len(rows), [None] * len(rows))]
    samples = []
    for index, datasource in enumerate(datasources(rows)):
        problems = [row for row in rows if row["datasource"] == datasource]
        for j, row in enumerate(problems):
            mean = score(index, step, slope) + 0.02 * (j - (len(problems) - 1) / 2)
            text = [m["content"] for m in row["prompt"] if m["role"] == "user"][-1]
            for k, reward in enumerate((mean - 0.01, mean + 0.01)):
                samples.append(SimpleNamespace(prompts=[text], group_ids=[f"{datasource}/{j}"], rollout_ids=[k],
                                               rewards=[reward], response_length=[10], truncated=[0]))
    return compute_eval_metrics(loader, samples, SAMPLES)


def molt_run(run_dir: Path, overrides: list[str], rows: list[dict], eval_steps: list[int], last_step: int,
             slope: float, per_step: int, train: dict[str, callable] | None = None) -> Path:
    """A run directory with the launcher's records of the real config and Molt-written TensorBoard events."""
    config = compose_config(*overrides)
    write_records(run_dir, config, command=None, warnings=[])
    (run_dir / ".hydra").mkdir()
    (run_dir / ".hydra" / "config.yaml").write_text(OmegaConf.to_yaml(config, resolve=True))
    (run_dir / ".hydra" / "overrides.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(overrides[1:])))
    args = SimpleNamespace(logger=SimpleNamespace(tensorboard_dir=str(run_dir / "tensorboard"),
                                                  wandb=SimpleNamespace(run_name=str(config.logger.run_name))))
    logger = TensorboardLogger(args)
    for step in eval_steps:
        logger.log_eval(step, eval_logs(rows, step, slope))
    for step in range(1, last_step + 1):
        logs = {metrics.ROLLOUTS_CONSUMED.removeprefix("train/"): float(per_step * step),
                metrics.STEP_TIME.removeprefix("train/"): STEP_SECONDS}
        logs.update({tag.removeprefix("train/"): value(step) for tag, value in (train or {}).items()})
        logger.log_train(step, logs)
    logger.close()
    return run_dir


def expected(rows: list[dict], step: int, slope: float) -> dict[str, float]:
    """The datasources' scores in % at `step`, and their mean."""
    values = {name: 100 * score(index, step, slope) for index, name in enumerate(datasources(rows))}
    return {**values, "mean": sum(values.values()) / len(values)}


def paper_csv(capsys, *args) -> tuple[int, list[dict[str, str]], str]:
    status = report([str(arg) for arg in args] + ["--format", "csv"])
    captured = capsys.readouterr()
    return status, list(csv.DictReader(io.StringIO(captured.out))), captured.err


def lines_of(rows: list[dict[str, str]], kind: str, model: str = "") -> dict[tuple[str, str], dict[str, str]]:
    """(point, column) -> the row of the line of `kind` whose model starts with `model`."""
    found = {}
    for row in rows:
        if row["kind"] == kind and row["model"].startswith(model) and not row["column"].endswith("_to_target"):
            assert (row["point"], row["column"]) not in found, "two lines match"
            found[(row["point"], row["column"])] = row
    return found


def assert_filled(rows, points: dict[str, int], columns: dict[str, str], values_at) -> None:
    """Every (point, column) of the run: the value written for the step it must read, that step, no gap."""
    run = lines_of(rows, "run")
    assert {point for point, _ in run} == set(points)
    for point, step in points.items():
        want = values_at(step)
        for column, key in columns.items():
            cell = run[(point, column)]
            assert cell["status"] == "" and cell["steps"] == str(step), (point, column, cell)
            assert float(cell["value"]) == pytest.approx(want[key], abs=1e-4), (point, column)  # float32 events


def gpu_hours(gpus: int, step: int) -> float:
    return gpus * step * STEP_SECONDS / 3600


def markdown(capsys, *args) -> str:
    assert report([str(arg) for arg in args]) == 0
    out = capsys.readouterr().out
    return out.split("\n## Beside the paper")[0]


def test_math_table_one_column_per_benchmark_at_the_budgets(tmp_path, capsys):
    rows = prepare("math_qwen2p5_1p5b", tmp_path / "data", {k: FIXTURES / v for k, v in MATH_SOURCES.items()}, capsys)
    assert datasources(rows) == ["math500", "amc23", "minerva", "aime25", "olympiadbench"]
    # The five-benchmark mean is 28 + 100 step / 19,500 %: 37.74 at step 1,900, 38.26 at 2,000, so it first
    # reaches the paper's 38.0 at the eval of step 2,000.
    slope = 1 / 19500
    run = molt_run(tmp_path / "run", ["experiment=math_qwen2p5_1p5b"], rows, list(range(0, 4013, 100)), 4012, slope,
                   128, {metrics.IS_FILTER_RATIO: lambda step: 0.002})
    status, out, err = paper_csv(capsys, run)
    assert status == 0, err
    columns = {"math500": "math500", "amc23": "amc23", "minerva": "minerva", "aime25": "aime25",
               "olympiadbench": "olympiadbench", "five_mean": "mean"}
    # 256k rollouts = step 2,000 and 512k = step 4,000 at 128 per update; step 0 is the base model.
    points = {"step 0 (base model)": 0, "256,000 rollouts": 2000, "512,000 rollouts": 4000}
    assert_filled(out, points, columns, lambda step: expected(rows, step, slope))
    run_lines = lines_of(out, "run")
    at_256k = run_lines[("256,000 rollouts", "five_mean")]
    assert (float(at_256k["rollouts"]), float(at_256k["gpu_hours"])) == (256000.0, pytest.approx(gpu_hours(16, 2000)))
    assert at_256k["grader"] == "strict" and at_256k["protocol"] == "avg@16, T=0.7, top-p 0.7, 4096 tokens"
    paper = lines_of(out, "paper", "paper: FlashREINFORCE")
    assert float(paper[("256,000 rollouts", "five_mean")]["value"]) == 38.0
    grpo = lines_of(out, "paper", "paper: GRPO")
    assert float(grpo[("512,000 rollouts", "five_mean")]["value"]) == 36.3  # taken by the paper from other papers
    assert paper[("256,000 rollouts", "math500")]["status"] == "not reported"
    assert paper[("256,000 rollouts", "five_mean")]["grader"] == "molt"
    target = {row["column"]: row for row in out if row["kind"] == "run" and row["column"].endswith("_to_target")}
    assert target["rollouts_to_target"]["steps"] == "2000"
    assert float(target["rollouts_to_target"]["value"]) == 2000 * 128
    assert float(target["gpu_hours_to_target"]["value"]) == pytest.approx(gpu_hours(16, 2000))


def test_r1_table_aime24_aime25_and_their_mean_at_each_reported_step(tmp_path, capsys):
    sources = {"sanity_train": FIXTURES / "sanity_train.jsonl", "sanity_test": FIXTURES / "sanity_test.jsonl"}
    rows = prepare("long_horizon_r1_distill_1p5b", tmp_path / "data", sources, capsys)
    assert datasources(rows) == ["aime24", "aime25"]
    slope = 2 / 100000
    run = molt_run(tmp_path / "run", ["experiment=long_horizon_r1_distill_1p5b"], rows, list(range(0, 6001, 128)), 6000,
                   slope, 128)
    status, out, err = paper_csv(capsys, run)
    assert status == 0, err
    # Evals every 128 updates: 3,968 and 4,992 are eval steps; 1,024-3,072 too; 6,000 reads 5,888.
    points = {"step 0 (base model)": 0, "step 1,024": 1024, "step 2,048": 2048, "step 3,072": 3072,
              "step 3,968": 3968, "step 4,992": 4992, "step 6,000": 5888}
    assert_filled(out, points, {"aime24": "aime24", "aime25": "aime25", "aime_mean": "mean"},
                  lambda step: expected(rows, step, slope))
    final = lines_of(out, "run")[("step 6,000", "aime_mean")]
    assert final["protocol"] == "avg@32, T=0.6, top-p 0.95, 8192 tokens" and final["grader"] == "strict"
    assert float(final["gpu_hours"]) == pytest.approx(gpu_hours(8, 5888))
    paper = lines_of(out, "paper", "paper: FlashREINFORCE")
    assert float(paper[("step 6,000", "aime_mean")]["value"]) == 33.7 and paper[("step 6,000", "aime_mean")]["steps"] == "5896"
    assert float(paper[("step 1,024", "aime24")]["value"]) == 28.13


def test_tool_table_three_tasks_their_mean_and_tool_calls_over_seeds(tmp_path, capsys):
    sources = {k: FIXTURES / v for k, v in MATH_SOURCES.items() if k in ("dapo", "amc23", "minerva", "aime25")}
    rows = prepare("python_tool_qwen2p5_7b", tmp_path / "data", sources, capsys)
    assert datasources(rows) == ["amc23", "minerva", "aime25"]
    slope = 1 / 5000
    runs = []
    for seed, calls in ((1, 3.0), (2, 3.5)):
        runs.append(molt_run(tmp_path / f"seed{seed}", ["experiment=python_tool_qwen2p5_7b", f"seed={seed}"], rows,
                             list(range(0, 601, 100)), 600, slope, 128, {metrics.TOOL_CALLS: lambda step, c=calls: c}))
    status, out, err = paper_csv(capsys, *runs)
    assert status == 0, err
    # Two seeds of one config are one line: their mean (the seeds' evals are equal) and its interval.
    seeds = {(row["point"], row["column"]): row for row in out if row["kind"] == "seeds" and not row["column"].endswith("_to_target")}
    assert {point for point, _ in seeds} == {"step 0 (base model)", "step 600"}
    want = expected(rows, 600, slope)
    for column, key in {"amc23": "amc23", "minerva": "minerva", "aime25": "aime25", "three_mean": "mean"}.items():
        cell = seeds[("step 600", column)]
        assert float(cell["value"]) == pytest.approx(want[key], abs=1e-4) and cell["seeds"] == "2"
        assert float(cell["ci_low"]) == pytest.approx(want[key], abs=1e-4) == float(cell["ci_high"])
    calls = seeds[("step 600", "tool_calls")]
    assert float(calls["value"]) == pytest.approx(3.25)
    assert (float(calls["ci_low"]), float(calls["ci_high"])) == (3.0, 3.5)  # the bootstrap's means of two seeds
    assert calls["protocol"] == "avg@4, T=0.7, top-p 0.7, 6144 tokens, 10 turns" and calls["grader"] == "strict"
    assert float(lines_of(out, "paper", "paper: FlashREINFORCE")[("step 600", "tool_calls")]["value"]) == 3.25


def test_moe_table_at_step_800(tmp_path, capsys):
    sources = {k: FIXTURES / v for k, v in MATH_SOURCES.items() if k in ("dapo", "amc23", "minerva", "aime25")}
    rows = prepare("moe_lag8_qwen3_30b_a3b", tmp_path / "data", sources, capsys)
    slope = 1 / 2000
    run = molt_run(tmp_path / "run", ["experiment=moe_lag8_qwen3_30b_a3b"], rows, list(range(0, 801, 100)), 800, slope,
                   128, {metrics.POLICY_LAG_MEAN: lambda step: 8.0, metrics.POLICY_LAG_MAX: lambda step: 9.0})
    status, out, err = paper_csv(capsys, run)
    assert status == 0, err
    assert_filled(out, {"step 0 (base model)": 0, "step 800": 800},
                  {"amc23": "amc23", "minerva": "minerva", "aime25": "aime25", "score": "mean"},
                  lambda step: expected(rows, step, slope))
    at_800 = lines_of(out, "run")[("step 800", "score")]
    assert float(at_800["gpu_hours"]) == pytest.approx(gpu_hours(32, 800))
    assert at_800["protocol"] == "avg@4, T=0.7, top-p 0.7, 16384 tokens, 10 turns"
    assert float(lines_of(out, "paper", "paper: FlashREINFORCE")[("step 800", "score")]["value"]) == 67.1


def test_alfworld_table_seen_and_unseen(tmp_path, capsys):
    pytest.importorskip("alfworld", reason="pip install 'molt-flashreinforce[alfworld]'")
    games = tmp_path / "games"
    write_games(str(games), rehearsal_games(2))
    rows = prepare("alfworld_qwen2p5_7b", tmp_path / "data", {"alfworld": games}, capsys)
    assert datasources(rows) == ["alfworld_valid_seen", "alfworld_valid_unseen"]
    slope = 1 / 400
    run = molt_run(tmp_path / "run", ["experiment=alfworld_qwen2p5_7b"], rows, list(range(0, 201, 40)), 200, slope, 64)
    status, out, err = paper_csv(capsys, run)
    assert status == 0, err
    assert_filled(out, {"step 0 (base model)": 0, "step 40": 40, "step 200": 200},
                  {"seen": "alfworld_valid_seen", "unseen": "alfworld_valid_unseen"},
                  lambda step: expected(rows, step, slope))
    at_200 = lines_of(out, "run")[("step 200", "seen")]
    assert at_200["grader"] == "alfworld" and at_200["protocol"] == "avg@3, T=1, top-p 0.7, 8192 tokens, 50 turns"
    assert float(at_200["rollouts"]) == 12800.0  # the paper's 12.8k trajectories by step 200
    paper = lines_of(out, "paper", "paper: FlashREINFORCE (delta")
    assert (float(paper[("step 200", "seen")]["value"]), float(paper[("step 200", "unseen")]["value"])) == (98.3, 96.5)


# ── eval directories, and a run the report cannot read ──

def eval_dir(path: Path, experiment: str, model: ModelRef, scores: dict[str, tuple[float, float]],
             protocol: Protocol, grader: str = "strict") -> Path:
    """An eval directory in eval_record's format: eval.json, the eval tags at the model's step, the config."""
    record = EvalRecord(experiment, model, protocol, grader, "vllm (cpu)",
                        {name: BenchmarkScore(avg, stderr, problems=30, samples=30 * protocol.avg_at_k)
                         for name, (avg, stderr) in scores.items()}, complete=True)
    write_record(path, record)
    writer = SummaryWriter(log_dir=str(path / "tensorboard"))
    for name, (avg, stderr) in scores.items():
        writer.add_scalar(metrics.eval_pass1(name), avg, model.step)
        writer.add_scalar(metrics.eval_pass1_stderr(name), stderr, model.step)
    writer.close()
    (path / ".hydra").mkdir()
    (path / ".hydra" / "config.yaml").write_text(f"experiment_name: {experiment}\n")
    return path


def test_eval_directories_are_lines_with_their_grader_protocol_and_standard_errors(tmp_path, capsys):
    protocol = Protocol(avg_at_k=32, temperature=0.6, top_p=0.95, max_tokens=8192)
    base = eval_dir(tmp_path / "base", "long_horizon_r1_distill_1p5b",
                    ModelRef("hf_id", "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B", 0),
                    {"aime24": (0.3, 0.03), "aime25": (0.2, 0.04)}, protocol, grader="molt")
    checkpoint = eval_dir(tmp_path / "ckpt", "long_horizon_r1_distill_1p5b",
                          ModelRef("hf_dir", "runs/r1/exports/step_1024", 1024, run_dir="runs/r1"),
                          {"aime24": (0.35, 0.03), "aime25": (0.25, 0.04)}, protocol)
    status, out, err = paper_csv(capsys, base, checkpoint)
    assert status == 0, err
    evals = {(row["point"], row["column"]): row for row in out if row["kind"] == "eval"}
    assert set(evals) == {(point, column) for point in ("step 0 (base model)", "step 1,024")
                          for column in ("aime24", "aime25", "aime_mean")}
    base_mean = evals[("step 0 (base model)", "aime_mean")]
    assert float(base_mean["value"]) == pytest.approx(25.0, abs=1e-4)
    # The mean of two benchmarks: sqrt(3^2 + 4^2) / 2 points.
    assert float(base_mean["stderr"]) == pytest.approx(2.5, abs=1e-4)
    assert base_mean["grader"] == "molt" and base_mean["protocol"] == protocol.describe()
    assert "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B" in base_mean["model"]
    assert float(evals[("step 1,024", "aime24")]["stderr"]) == pytest.approx(3.0, abs=1e-4)
    assert evals[("step 1,024", "aime24")]["grader"] == "strict"
    md = markdown(capsys, base, checkpoint)
    assert "| 30.00 ± 3.00 | 20.00 ± 4.00 | 25.00 ± 2.50 |" in md
    assert "- molt: Molt's example math grader's rules" in md and "- strict: this package's strict grader" in md


def test_a_run_whose_tags_match_nothing_exits_1_naming_what_it_looked_for(tmp_path, capsys):
    """R1 logs as they were before one name per benchmark: eval_aime_2024 instead of the recipe's aime24."""
    run = tmp_path / "run"
    writer = SummaryWriter(log_dir=str(run / "tensorboard" / "r1"))
    for step in range(0, 6001, 128):
        writer.add_scalar("eval/eval_aime_2024_pass1", 0.3, step)
        writer.add_scalar("eval/eval_aime_2025_pass1", 0.2, step)
    writer.close()
    for view in ("paper", "compare"):
        status = report([str(run), "--experiment", "long_horizon_r1_distill_1p5b", "--view", view, "--format", "csv"])
        err = capsys.readouterr().err
        assert status == 1, err
        assert "long_horizon_r1_distill_1p5b: no measured cell could be filled" in err
        assert "looked for eval/eval_aime24_pass1, eval/eval_aime25_pass1" in err
        assert ("the closest eval tags they have: eval/eval_aime_2024_pass1 (for eval/eval_aime24_pass1), "
                "eval/eval_aime_2025_pass1 (for eval/eval_aime25_pass1)") in err


def test_a_partly_filled_table_says_which_lines_are_missing_and_why(tmp_path, capsys):
    sources = {"sanity_train": FIXTURES / "sanity_train.jsonl", "sanity_test": FIXTURES / "sanity_test.jsonl"}
    rows = [row for row in prepare("long_horizon_r1_distill_1p5b", tmp_path / "data", sources, capsys)
            if row["datasource"] == "aime24"]  # an eval file without AIME25
    run = molt_run(tmp_path / "run", ["experiment=long_horizon_r1_distill_1p5b"], rows, [0, 128, 256], 300, 1e-5, 128)
    status = report([str(run)])
    out = capsys.readouterr().out
    assert status == 0
    assert "- experiment=long_horizon_r1_distill_1p5b algo=flashreinforce: step 1,024 not reached (the run ends at step 300)" in out
    assert (f"- experiment=long_horizon_r1_distill_1p5b algo=flashreinforce, step 0 (base model), AIME25: not in this run: "
            f"no {metrics.eval_pass1('aime25')}") in out
    assert not math.isnan(float(out.split("| step 0 (base model) | 0 | ")[2].split(" |")[0]))  # AIME24 filled
