"""`molt-flashreinforce-report` on real TensorBoard event files.

Every event file here is written by torch's `SummaryWriter` (the writer Molt's
`TensorboardLogger` and the local backend use) and read back through the command's own path.
Expected values are worked out by hand from the scalars each test writes; the paper numbers
are the ones in spec §3 (checked against the shipped file in test_report_paper.py).
"""

from __future__ import annotations

import csv
import io
import math
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from torch.utils.tensorboard import SummaryWriter

from molt_flashreinforce import metrics
from molt_flashreinforce.data.recipes import eval_datasources
from molt_flashreinforce.report.cli import main
from molt_flashreinforce.report.events import read_scalars
from molt_flashreinforce.report.paper import load_paper_results
from molt_flashreinforce.report.plot import paper_points
from molt_flashreinforce.report.runs import expand_run_dirs

HYDRA_APP = Path(__file__).parent / "fixtures" / "report" / "hydra_app" / "app.py"
TOOL_TASKS = eval_datasources("python_tool_qwen2p5_7b")
SEEN, UNSEEN = eval_datasources("alfworld_qwen2p5_7b")  # the data command's names, not a copy
AIME24, AIME25 = eval_datasources("long_horizon_r1_distill_1p5b")
NO_COST = "n/a | n/a | n/a | n/a"  # the cost cells of a run that logged no step times or token counts


def write_events(run_dir: Path, scalars: dict[str, dict[int, float]], subdir: str = "tensorboard/run") -> None:
    """Molt's layout: <run_dir>/tensorboard/<run_name>/events.out.tfevents.*"""
    writer = SummaryWriter(log_dir=str(run_dir / subdir))
    for tag, by_step in scalars.items():
        for step, value in by_step.items():
            writer.add_scalar(tag, value, step)
    writer.close()


def make_run(run_dir: Path, config: dict | None, scalars: dict[str, dict[int, float]],
             overrides: list[str] | None = None) -> Path:
    if config is not None:
        (run_dir / ".hydra").mkdir(parents=True)
        (run_dir / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config))
        (run_dir / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides or []))
    write_events(run_dir, scalars)
    return run_dir


def tool_scalars(per_task: dict[str, dict[int, float]], tool_calls: dict[int, float] | None = None) -> dict:
    scalars = {metrics.eval_pass1(task): values for task, values in per_task.items()}
    if tool_calls is not None:
        scalars[metrics.TOOL_CALLS] = tool_calls
    return scalars


def report(capsys, *args: str) -> tuple[int, str, str]:
    status = main([str(arg) for arg in args])
    out = capsys.readouterr()
    return status, out.out, out.err


def csv_rows(text: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(text)))


def only(rows: list[dict[str, str]], **match: str) -> dict[str, str]:
    found = [row for row in rows if all(row[key] == value for key, value in match.items())]
    assert len(found) == 1, (match, found)
    return found[0]


def test_tool_task_uses_last_eval_at_or_before_step_600_and_tool_calls(tmp_path, capsys):
    # Async eval can land off-cadence (590, 610): step 600 must use 590, never 610.
    evals = {
        "amc23": {0: 0.1, 590: 0.5, 610: 0.9},
        "minerva": {0: 0.1, 590: 0.3, 610: 0.9},
        "aime25": {0: 0.1, 590: 0.1, 610: 0.9},
    }
    tool_calls = {step: step / 100 for step in range(0, 701, 10)}
    run = make_run(tmp_path / "run", {"experiment_name": "python_tool_qwen2p5_7b",
                                      "algo": {"name": "flashreinforce", "entropy_filter_q": 1.0}},
                   tool_scalars(evals, tool_calls))
    status, out, err = report(capsys, run, "--format", "csv", "--view", "compare")
    assert status == 0, err
    rows = csv_rows(out)
    score = only(rows, row="score_600")
    assert int(score["step_used"]) == 590
    assert float(score["this_run"]) == pytest.approx((0.5 + 0.3 + 0.1) / 3 * 100)  # 30.0 %
    assert float(score["paper"]) == 37.0
    assert float(score["difference"]) == pytest.approx(30.0 - 37.0)
    assert score["sources"] == "R H" and score["provenance"] == "primary"
    calls = only(rows, row="tool_calls_600")
    assert (int(calls["step_used"]), float(calls["this_run"]), float(calls["paper"])) == (600, 6.0, 3.25)
    peak = only(rows, row="score_peak")  # best eval anywhere: step 610, all 0.9
    assert int(peak["step_used"]) == 610 and float(peak["this_run"]) == pytest.approx(90.0)
    assert peak["provenance"] == "secondary"


def test_config_picks_the_paper_arm(tmp_path, capsys):
    evals = {task: {600: 0.4} for task in TOOL_TASKS}
    grpo = make_run(tmp_path / "grpo", {"experiment_name": "python_tool_qwen2p5_7b", "algo": {"name": "grpo"}},
                    tool_scalars(evals, {600: 0.0}))
    q09 = make_run(tmp_path / "q09", {"experiment_name": "python_tool_qwen2p5_7b",
                                      "algo": {"name": "flashreinforce", "entropy_filter_q": 0.9}},
                   tool_scalars(evals, {600: 2.0}))
    q05 = make_run(tmp_path / "q05", {"experiment_name": "python_tool_qwen2p5_7b",
                                      "algo": {"name": "flashreinforce", "entropy_filter_q": 0.5}},
                   tool_scalars(evals, {600: 2.0}))
    status, out, err = report(capsys, grpo, q09, q05, "--format", "csv", "--view", "compare")
    assert status == 0, err
    rows = csv_rows(out)
    assert float(only(rows, run="grpo", row="score_600")["paper"]) == 30.3
    assert float(only(rows, run="grpo", row="tool_calls_600")["paper"]) == 0.0
    assert float(only(rows, run="q09", row="score_peak")["paper"]) == 39.4  # Table 19, the more specific arm
    assert only(rows, run="q09", row="score_600")["paper"] == ""  # the paper has no step-600 number for q = 0.9
    unmatched = only(rows, run="q05", row="score_600")
    assert unmatched["paper"] == "" and unmatched["paper_arm"] == "no paper arm matches this config"
    assert float(unmatched["this_run"]) == pytest.approx(40.0)


def test_metric_missing_from_a_run_says_not_in_this_run(tmp_path, capsys):
    evals = {task: {600: 0.4} for task in TOOL_TASKS}
    run = make_run(tmp_path / "run", {"experiment_name": "python_tool_qwen2p5_7b", "algo": {"name": "grpo"}},
                   tool_scalars(evals))  # no train/tool_calls
    status, out, err = report(capsys, run)
    assert status == 0, err
    calls_line = next(line for line in out.splitlines() if "tool calls per trajectory | step 600" in line)
    cells = [cell.strip() for cell in calls_line.strip("|").split("|")]
    assert cells[10] == "not in this run" and cells[11] == "—"
    assert f"no {metrics.TOOL_CALLS}" in out  # the note under the table names the absent tag


def test_multirun_sweep_becomes_one_table_in_job_order(tmp_path, capsys):
    # Real Hydra multirun directories: the sweep dir, numbered job subdirs, .hydra/ records.
    subprocess.run(
        [sys.executable, str(HYDRA_APP), "-m", f"out={tmp_path}", "algo.name=flashreinforce,grpo", "seed=1,2"],
        check=True, capture_output=True, cwd=tmp_path,
    )
    sweep = tmp_path / "sweep"
    jobs = [path for path, _ in expand_run_dirs([sweep])]
    assert [job.name.split("_")[0] for job in jobs] == ["0", "1", "2", "3"]
    for number, job in enumerate(jobs):
        write_events(job, tool_scalars({task: {600: number / 10} for task in TOOL_TASKS}, {600: float(number)}))
    status, out, err = report(capsys, sweep, "--format", "csv", "--view", "compare")
    assert status == 0, err
    rows = csv_rows(out)
    assert {row["experiment"] for row in rows} == {"python_tool_qwen2p5_7b"}  # from each job's config
    labels = list(dict.fromkeys(row["run"] for row in rows))
    # Overrides shared by every job (out=...) are dropped from the labels.
    assert labels == ["algo.name=flashreinforce seed=1", "algo.name=flashreinforce seed=2",
                      "algo.name=grpo seed=1", "algo.name=grpo seed=2"]
    scores = [float(only(rows, run=label, row="score_600")["this_run"]) for label in labels]
    assert scores == pytest.approx([0.0, 10.0, 20.0, 30.0])
    papers = [float(only(rows, run=label, row="score_600")["paper"]) for label in labels]
    assert papers == [37.0, 37.0, 30.3, 30.3]


def test_r1_curve_final_and_infinite_delta_arm(tmp_path, capsys):
    # Eval every 128 updates: the protocol's 3,968 / 4,992 are eval steps; 6,000 falls back to 5,888.
    steps = range(0, 6001, 128)
    trust = {metrics.eval_pass1(AIME24): {s: 0.2 + s / 60000 for s in steps},
             metrics.eval_pass1(AIME25): {s: 0.2 for s in steps}}
    run = make_run(tmp_path / "trust", {"experiment_name": "long_horizon_r1_distill_1p5b",
                                        "algo": {"name": "flashreinforce", "delta": 5.0e-3}}, trust)
    no_trust = make_run(tmp_path / "is_only", {"experiment_name": "long_horizon_r1_distill_1p5b",
                                               "algo": {"name": "flashreinforce", "delta": math.inf}}, trust)
    status, out, err = report(capsys, run, no_trust, "--format", "csv", "--view", "compare")
    assert status == 0, err
    rows = csv_rows(out)
    final = only(rows, run="trust", row="mean_final")
    assert int(final["step_used"]) == 5888
    assert float(final["this_run"]) == pytest.approx(((0.2 + 5888 / 60000) + 0.2) / 2 * 100)
    assert (float(final["paper"]), float(final["paper_step"]), final["sources"]) == (33.7, 5896.0, "R H P3")
    assert int(only(rows, run="trust", row="mean_3968")["step_used"]) == 3968
    assert float(only(rows, run="trust", row="mean_0")["paper"]) == 21.7  # the authors' value over [P3t]'s 21.67
    assert float(only(rows, run="is_only", row="mean_final")["paper"]) == 30.6
    assert float(only(rows, run="is_only", row="mean_1024")["paper"]) == 25.83
    assert only(rows, run="is_only", row="mean_1024")["provenance"] == "secondary"
    status, out, _ = report(capsys, run)
    # Shown at the paper's precision: two decimals where [P3t] gives two, one where [R] gives one.
    assert f"| step 1,024 | 1,024 | — | {NO_COST} | 25.73 | {(0.2 + 1024 / 60000 + 0.2) / 2 * 100:.2f} |" in out
    assert f"| step 0 | 0 | — | {NO_COST} | 21.7 | 20.0 | -1.7 |" in out


def test_math_budget_peak_and_rejection_rate(tmp_path, capsys):
    five = ("math500", "amc23", "minerva", "aime25", "olympiadbench")
    # The 68-pass run: 4,012 updates, eval every 100 (the last at 4,000), a late eval past the
    # run's end (step 4,100) that the end row must not read.
    evals = {metrics.eval_pass1(ds): {s: 0.3 + (0.08 if s == 1500 else 0.0) + (0.01 if s == 4000 else 0.0)
                                      + (0.5 if s == 4100 else 0.0) for s in range(0, 4101, 100)} for ds in five}
    train = {metrics.ROLLOUTS_CONSUMED: {s: 128.0 * s for s in range(1, 4013)},
             # no train/is_filter_ratio: the rejection rate comes from 1 - acceptance rate
             metrics.ACCEPTANCE_RATE: {s: (0.99 if s % 2 else 1.0) for s in range(1, 4013)}}
    run = make_run(tmp_path / "flash", {"experiment_name": "math_qwen2p5_1p5b", "algo": {"name": "flashreinforce"}},
                   {**evals, **train})
    status, out, err = report(capsys, run, "--format", "csv", "--view", "compare")
    assert status == 0, err
    rows = csv_rows(out)
    # The headline comes first: the evaluation at 256k rollouts, then the run's peak and its end.
    assert [row["row"] for row in rows][:3] == ["budget_256k", "peak_4000", "end_4012"]
    budget = only(rows, row="budget_256k")  # 256,000 / 128 = step 2,000, an eval step
    assert (int(budget["step_used"]), float(budget["rollouts"]), float(budget["paper"])) == (2000, 256000.0, 38.0)
    assert float(budget["this_run"]) == pytest.approx(30.0)
    assert int(only(rows, row="budget_512k")["step_used"]) == 4000
    peak = only(rows, row="peak_4000")
    assert (int(peak["step_used"]), float(peak["this_run"])) == (1500, pytest.approx(38.0))
    end = only(rows, row="end_4012")
    assert (int(end["step_used"]), float(end["this_run"]), end["paper"]) == (4000, pytest.approx(31.0), "")
    rejection = only(rows, row="rejection")
    assert float(rejection["this_run"]) == pytest.approx(0.5)  # half the steps reject 1 %
    assert float(rejection["paper"]) == 0.13


def test_budget_row_without_rollouts_consumed_is_not_in_this_run(tmp_path, capsys):
    evals = {metrics.eval_pass1(ds): {2000: 0.4} for ds in ("math500", "amc23", "minerva", "aime25", "olympiadbench")}
    run = make_run(tmp_path / "flash", {"experiment_name": "math_qwen2p5_1p5b", "algo": {"name": "flashreinforce"}}, evals)
    status, out, err = report(capsys, run, "--format", "csv", "--view", "compare")
    assert status == 0, err
    budget = only(csv_rows(out), row="budget_256k")
    assert budget["this_run"] == "" and budget["status"].startswith("not in this run")
    assert metrics.ROLLOUTS_CONSUMED in budget["status"]


def test_alfworld_seen_unseen_at_step_200_and_40(tmp_path, capsys):
    steps = range(0, 321, 40)
    scalars = {metrics.eval_pass1(SEEN): {s: s / 400 for s in steps},
               metrics.eval_pass1(UNSEEN): {s: s / 500 for s in steps}}
    run = make_run(tmp_path / "no_is", {"experiment_name": "alfworld_qwen2p5_7b",
                                        "algo": {"name": "flashreinforce", "importance_sampling": False}}, scalars)
    status, out, err = report(capsys, run, "--format", "csv", "--view", "compare")
    assert status == 0, err
    rows = csv_rows(out)
    assert float(only(rows, row="seen_200")["this_run"]) == pytest.approx(50.0)
    assert float(only(rows, row="unseen_200")["this_run"]) == pytest.approx(40.0)
    seen_40 = only(rows, row="seen_40")
    assert (float(seen_40["this_run"]), float(seen_40["paper"])) == (pytest.approx(10.0), 35.0)  # no-IS arm
    assert only(rows, row="seen_200")["paper"] == ""  # the paper has no step-200 number for that arm


def test_experiment_from_hydra_choice_and_flag(tmp_path, capsys):
    """No experiment_name: the Hydra group choice in .hydra/hydra.yaml names it; --experiment overrides.
    A single run is labelled by its experiment and algorithm, not by its time-stamped directory."""
    run = make_run(tmp_path / "2026-12-01_09-00-00", {"algo": {"name": "flashreinforce"}},
                   {metrics.eval_pass1("tiny"): {0: 0.1, 50: 0.6}})
    (run / ".hydra" / "hydra.yaml").write_text(yaml.safe_dump({"hydra": {"runtime": {"choices": {"experiment": "tiny"}}}}))
    status, out, err = report(capsys, run, "--format", "csv", "--view", "compare")
    assert status == 0, err
    assert float(only(csv_rows(out), row="final")["this_run"]) == pytest.approx(60.0)
    assert {row["run"] for row in csv_rows(out)} == {"experiment=tiny algo=flashreinforce"}
    # Forced onto the MoE experiment, the tiny run has none of its tags: the table is printed, empty, and
    # the command exits 1 naming what it looked for.
    status, out, err = report(capsys, run, "--experiment", "moe_lag8_qwen3_30b_a3b", "--format", "csv", "--view", "compare")
    assert status == 1 and {row["experiment"] for row in csv_rows(out)} == {"moe_lag8_qwen3_30b_a3b"}
    assert "moe_lag8_qwen3_30b_a3b: no measured cell could be filled" in err and metrics.eval_pass1("amc23") in err
    # Last resort: an `experiment=` override; it is left out of the label (the table names it).
    by_override = make_run(tmp_path / "by_override", {"algo": {"name": "grpo"}},
                           {metrics.eval_pass1("tiny"): {0: 0.1}}, overrides=["experiment=tiny", "seed=3"])
    status, out, err = report(capsys, by_override, "--format", "csv", "--view", "compare")
    assert status == 0, err
    assert {(row["experiment"], row["run"], row["paper_arm"]) for row in csv_rows(out)} == {("tiny", "experiment=tiny algo=grpo seed=3", "GRPO")}


def test_run_without_config_uses_default_arm_and_needs_experiment(tmp_path, capsys):
    bare = tmp_path / "bare"
    write_events(bare, tool_scalars({task: {600: 0.37} for task in TOOL_TASKS}, {600: 3.25}))
    status, out, err = report(capsys, bare)
    assert status == 2 and "pass --experiment NAME" in err
    status, out, err = report(capsys, bare, "--experiment", "python_tool_qwen2p5_7b", "--format", "csv", "--view", "compare")
    assert status == 0, err
    score = only(csv_rows(out), row="score_600")
    assert float(score["difference"]) == pytest.approx(0.0, abs=1e-4)  # TensorBoard stores float32
    assert "assumed" in score["paper_arm"]


@pytest.mark.parametrize("make_bad, expected", [
    (lambda tmp: tmp / "missing", "does not exist"),
    (lambda tmp: (tmp / "file.txt").write_text("x") and tmp / "file.txt", "is not a directory"),
    (lambda tmp: (tmp / "empty").mkdir() or tmp / "empty", "neither a run directory"),
])
def test_bad_paths_give_a_clear_error(tmp_path, capsys, make_bad, expected):
    bad = make_bad(tmp_path)
    status, out, err = report(capsys, bad)
    assert status == 2 and expected in err and str(bad) in err and out == ""


def test_run_dir_without_event_files_is_an_error_but_a_failed_sweep_job_is_a_row(tmp_path, capsys):
    subprocess.run([sys.executable, str(HYDRA_APP), f"out={tmp_path}"], check=True, capture_output=True, cwd=tmp_path)
    status, out, err = report(capsys, tmp_path / "run")
    assert status == 2 and "no TensorBoard event files" in err
    subprocess.run([sys.executable, str(HYDRA_APP), "-m", f"out={tmp_path}", "seed=1,2"],
                   check=True, capture_output=True, cwd=tmp_path)
    first, _ = expand_run_dirs([tmp_path / "sweep"])[0]
    write_events(first, tool_scalars({task: {600: 0.5} for task in TOOL_TASKS}, {600: 1.0}))
    status, out, err = report(capsys, tmp_path / "sweep", "--format", "csv", "--view", "compare")
    assert status == 0 and "warning" in err
    rows = csv_rows(out)
    assert float(only(rows, run="seed=1", row="score_600")["this_run"]) == pytest.approx(50.0)
    assert only(rows, run="seed=2", row="score_600")["status"] == "not in this run: no event files"


def test_unknown_experiment_is_a_clear_error(tmp_path, capsys):
    run = make_run(tmp_path / "run", {"experiment_name": "tiny"}, {metrics.eval_pass1("tiny"): {0: 0.1}})
    status, out, err = report(capsys, run, "--experiment", "nope")
    assert status == 2 and "unknown experiment 'nope'" in err and "python_tool_qwen2p5_7b" in err


def test_resumed_run_latest_write_of_a_step_wins(tmp_path):
    run = tmp_path / "run"
    write_events(run, {metrics.TOOL_CALLS: {1: 1.0, 2: 2.0}}, subdir="tensorboard/first")
    write_events(run, {metrics.TOOL_CALLS: {2: 5.0, 3: 6.0}}, subdir="tensorboard/resumed")
    assert read_scalars(run)[metrics.TOOL_CALLS] == ((1, 1.0), (2, 5.0), (3, 6.0))


def test_an_eval_directory_inside_a_run_is_not_part_of_the_runs_events(tmp_path):
    run = tmp_path / "run"
    write_events(run, {metrics.eval_pass1("tiny"): {4: 0.25}})
    nested = run / "evals" / "step_4"
    nested.mkdir(parents=True)
    (nested / "eval.json").write_text("{}")
    write_events(nested, {metrics.eval_pass1("tiny"): {4: 0.75}}, subdir="tensorboard")
    assert read_scalars(run)[metrics.eval_pass1("tiny")] == ((4, 0.25),)
    assert read_scalars(nested)[metrics.eval_pass1("tiny")] == ((4, 0.75),)


def test_markdown_and_latex_render(tmp_path, capsys):
    run = make_run(tmp_path / "run", {"experiment_name": "python_tool_qwen2p5_7b", "algo": {"name": "grpo"}},
                   tool_scalars({task: {600: 0.25} for task in TOOL_TASKS}, {600: 0.5}), overrides=["algo=grpo"])
    status, out, _ = report(capsys, run)
    assert status == 0
    assert ("| experiment=python_tool_qwen2p5_7b algo=grpo | AMC23/Minerva/AIME25 mean avg@4 (%) | step 600 | 600 | — | "
            f"{NO_COST} | 30.3 | 25.0 | -5.3 |") in out
    assert "[H] FlashREINFORCE project page results table (primary)" in out
    status, out, _ = report(capsys, run, "--format", "latex", "--view", "compare")
    assert status == 0
    assert r"\begin{tabular}" in out and r"\bottomrule" in out
    assert r"AMC23/Minerva/AIME25 mean avg@4 (\%)" in out and r"run $-$ paper" in out


def test_plot_writes_png_with_paper_points(tmp_path, capsys):
    paper = load_paper_results()
    r1 = paper.experiment("long_horizon_r1_distill_1p5b")
    trust = dict(paper_points(paper, r1, "aime_mean")["trust"])
    assert trust[0] == 21.7 and trust[5896] == 33.7 and trust[3968] == 30.83
    assert dict(paper_points(paper, r1, "aime24")["is_only"])[1024] == 27.60
    tiny = tmp_path / "tiny"
    make_run(tiny, {"experiment_name": "tiny", "algo": {"name": "flashreinforce"}},
             {metrics.eval_pass1("tiny"): {0: 0.1, 10: 0.4, 20: 0.7},
              metrics.ROLLOUTS_CONSUMED: {s: 16.0 * s for s in range(1, 21)}})
    png = tmp_path / "curves.png"
    status, _, err = report(capsys, tiny, "--plot", png)
    assert status == 0, err
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    status, _, err = report(capsys, tiny, "--plot", tmp_path / "no" / "dir.png")
    assert status == 2 and "does not exist" in err


def test_protocol_point_before_the_first_log_and_tags_never_logged_together(tmp_path, capsys):
    steps = range(80, 241, 80)
    run = make_run(tmp_path / "late", {"experiment_name": "alfworld_qwen2p5_7b", "algo": {"name": "flashreinforce"}},
                   {metrics.eval_pass1(SEEN): {s: 0.5 for s in steps},
                    metrics.eval_pass1(UNSEEN): {s + 1: 0.5 for s in steps}})
    status, out, err = report(capsys, run, "--format", "csv", "--view", "compare")
    assert status == 0, err
    rows = csv_rows(out)
    assert only(rows, row="seen_40")["status"] == "nothing at or before step 40: first value at step 80"
    assert int(only(rows, row="seen_200")["step_used"]) == 160
    assert int(only(rows, row="unseen_200")["step_used"]) == 161  # an off-cadence eval still counts
    tool = make_run(tmp_path / "split", {"experiment_name": "python_tool_qwen2p5_7b", "algo": {"name": "grpo"}},
                    tool_scalars({"amc23": {600: 0.5}, "minerva": {590: 0.5}, "aime25": {600: 0.5}}))
    status, out, err = report(capsys, tool, "--format", "csv", "--view", "compare")
    assert only(csv_rows(out), row="score_600")["status"].startswith("not in this run: never at one shared step")


# ---------------------------------------------------------------- the policy-lag block

MOE = "moe_lag8_qwen3_30b_a3b"


def lag_run(path, algo: dict, means: dict[int, float], maxima: dict[int, float]):
    return make_run(path, {"experiment_name": MOE, "algo": algo},
                    {metrics.POLICY_LAG_MEAN: means, metrics.POLICY_LAG_MAX: maxima})


def test_measured_lag_over_the_protocols_steps_beside_the_papers(tmp_path, capsys):
    # Steps up to 800 count (the protocol's horizon); step 801 is beyond it and ignored.
    bounded = lag_run(tmp_path / "bounded", {"name": "flashreinforce", "delta": 1.0e-2},
                      {1: 7.0, 400: 8.0, 800: 8.5, 801: 30.0}, {1: 7.0, 400: 8.0, 800: 9.0, 801: 30.0})
    drifting = lag_run(tmp_path / "drifting", {"name": "flashreinforce", "delta": 1.0e-2},
                       {1: 8.0, 800: 11.0}, {1: 8.0, 800: 11.0})
    grpo = lag_run(tmp_path / "grpo", {"name": "grpo"}, {1: 1.0, 800: 1.0}, {1: 1.0, 800: 2.0})
    status, out, err = report(capsys, bounded, drifting, grpo)
    assert status == 0, err
    assert "Policy lag, `moe_lag8_qwen3_30b_a3b` (updates; steps ≤ 800; flagged when more than 1 off" in out
    assert "| bounded | 7.83 | 9.00 | 800 | 8 |  |" in out  # within 1 of the paper's 8, max 9 = 8 + 1
    assert "| drifting | 9.50 | 11.00 | 800 | 8 | OFF THE PAPER'S LAG |" in out
    assert "| grpo | 1.00 | 2.00 | 800 | 1 |  |" in out  # GRPO's arm: the paper's lag of 1


def test_a_max_more_than_one_past_the_papers_lag_is_flagged(tmp_path, capsys):
    spiky = lag_run(tmp_path / "spiky", {"name": "flashreinforce", "delta": 1.0e-2},
                    {1: 8.0, 2: 8.0}, {1: 8.0, 2: 10.0})
    status, out, _ = report(capsys, spiky)
    assert "| 8.00 | 10.00 | 2 | 8 | OFF THE PAPER'S LAG |" in out  # a lone run is labelled by its config


def test_experiment_without_a_stated_lag_and_run_without_lag_tags(tmp_path, capsys):
    run = make_run(tmp_path / "math", {"experiment_name": "math_qwen2p5_1p5b", "algo": {"name": "flashreinforce"}},
                   {metrics.POLICY_LAG_MEAN: {1: 3.0}, metrics.POLICY_LAG_MAX: {1: 5.0}})
    status, out, _ = report(capsys, run)
    assert "Policy lag, `math_qwen2p5_1p5b` (updates; all steps;" in out
    assert "| 3.00 | 5.00 | 1 | not stated |  |" in out
    silent = make_run(tmp_path / "silent", {"experiment_name": MOE, "algo": {"name": "grpo"}},
                      {metrics.eval_pass1("amc23"): {1: 0.5}})
    status, out, _ = report(capsys, silent)
    assert "| — | — | — | 1 |  |" in out


@pytest.mark.parametrize("fmt", ["csv", "latex"])
def test_machine_formats_are_unchanged(tmp_path, capsys, fmt):
    run = lag_run(tmp_path / "bounded", {"name": "flashreinforce"}, {1: 8.0}, {1: 8.0})
    status, out, _ = report(capsys, run, "--format", fmt, "--view", "compare")
    assert status == 0 and "Policy lag," not in out
