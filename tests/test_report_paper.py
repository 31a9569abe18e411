"""The reported numbers file: its content against the reproduction spec, and its validator.

The expected numbers below are transcribed independently from spec §3 (tables 3.1-3.4), so
a typo in `paper_results.yaml` fails here. Malformed files are made by mutating a copy of the
shipped one, so each case differs from a valid file in exactly one place.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from molt_flashreinforce import conf
from molt_flashreinforce.data.recipes import eval_datasources
from molt_flashreinforce.report.cli import main
from molt_flashreinforce.report.paper import DEFAULT_PATH, PaperResultsError, load_paper_results

REPO = Path(__file__).resolve().parents[1]
PAPER_EXPERIMENTS = set(conf.experiments())  # the paper's and the CPU miniature


@pytest.fixture(scope="module")
def paper():
    return load_paper_results()


def table_value(paper, experiment: str, row: str, arm: str):
    """The entries for one table cell, primary sources first."""
    entries = [e for e in paper.experiment(experiment).reported if e.row == row and e.arm == arm]
    assert entries, (experiment, row, arm)
    return sorted(entries, key=paper.is_secondary)


def test_repo_link_is_the_packaged_file():
    assert (REPO / "experiments" / "paper_results.yaml").resolve() == DEFAULT_PATH.resolve()


def test_every_experiment_has_numbers_and_a_protocol(paper):
    assert set(paper.experiments) == PAPER_EXPERIMENTS
    launchable = {path.stem for path in (REPO / "molt_flashreinforce" / "conf" / "experiment").glob("*.yaml")}
    assert launchable <= set(paper.experiments), "an experiment config without paper numbers"
    for experiment in paper.experiments.values():
        assert experiment.protocol["summary"] and experiment.rows
        if experiment.name != "tiny":
            assert any(entry.row for entry in experiment.reported), experiment.name
        # The eval metrics read exactly the eval datasources the data recipe writes, by their names.
        eval_datasets = {tag.split("/eval_")[1].rsplit("_pass1", 1)[0]
                         for metric in experiment.metrics.values() for alt in metric.alternatives
                         for tag in alt.tags if tag.startswith("eval/")}
        assert eval_datasets == set(experiment.datasets) == set(eval_datasources(experiment.name)), experiment.name


def test_eval_names_come_from_the_data_recipes(paper):
    assert paper.experiment("long_horizon_r1_distill_1p5b").datasets == ("aime24", "aime25")
    alfworld = paper.experiment("alfworld_qwen2p5_7b")
    assert alfworld.metrics["seen"].alternatives[0].tags == ("eval/eval_alfworld_valid_seen_pass1",)
    assert paper.experiment("math_qwen2p5_1p5b").metrics["five_mean"].datasources == (
        "math500", "amc23", "minerva", "aime25", "olympiadbench")


@pytest.mark.parametrize("experiment, row, arm, value, sources", [
    # §3.1 headline table [R] (+ [H])
    ("long_horizon_r1_distill_1p5b", "mean_0", "trust", 21.7, ("R", "H")),
    ("long_horizon_r1_distill_1p5b", "mean_final", "trust", 33.7, ("R", "H", "P3")),
    ("math_qwen2p5_1p5b", "budget_256k", "flashreinforce", 38.0, ("R", "H", "P3")),
    ("math_qwen2p5_1p5b", "budget_512k", "grpo", 36.3, ("R", "H", "P3")),
    ("python_tool_qwen2p5_7b", "score_600", "flashreinforce", 37.0, ("R", "H")),
    ("python_tool_qwen2p5_7b", "tool_calls_600", "flashreinforce", 3.25, ("R", "H")),
    ("python_tool_qwen2p5_7b", "score_600", "grpo", 30.3, ("H",)),
    ("python_tool_qwen2p5_7b", "tool_calls_600", "grpo", 0.0, ("H",)),
    ("alfworld_qwen2p5_7b", "seen_200", "flashreinforce", 98.3, ("R", "H")),
    ("alfworld_qwen2p5_7b", "unseen_200", "flashreinforce", 96.5, ("R", "H")),
    # §3.2 via [P3]
    ("moe_lag8_qwen3_30b_a3b", "score_800", "flashreinforce", 67.1, ("P3",)),
    ("moe_lag8_qwen3_30b_a3b", "score_800", "grpo", 60.3, ("P3",)),
    ("alfworld_qwen2p5_7b", "seen_200", "c_rf", 90.5, ("P3",)),
    ("alfworld_qwen2p5_7b", "unseen_200", "c_rf", 86.3, ("P3",)),
    ("alfworld_qwen2p5_7b", "seen_200", "grpo", 78.6, ("P3",)),
    ("alfworld_qwen2p5_7b", "unseen_200", "grpo", 76.8, ("P3",)),
    ("long_horizon_r1_distill_1p5b", "mean_final", "is_only", 30.6, ("P3",)),
    # §3.4 ablations
    ("math_qwen2p5_1p5b", "peak_4000", "flashreinforce", 37.97, ("P3",)),
    ("math_qwen2p5_1p5b", "rejection", "flashreinforce", 0.13, ("P3", "P3m")),
    ("python_tool_qwen2p5_7b", "score_peak", "flashreinforce", 37.0, ("P3",)),
    ("python_tool_qwen2p5_7b", "score_peak", "entropy_q09", 39.4, ("P3",)),
    ("python_tool_qwen2p5_7b", "score_peak", "entropy_q02", 32.2, ("P3",)),
    ("python_tool_qwen2p5_7b", "score_peak", "entropy_q00", 13.1, ("P3",)),
    ("alfworld_qwen2p5_7b", "seen_40", "flashreinforce", 81.0, ("P3",)),
    ("alfworld_qwen2p5_7b", "unseen_40", "flashreinforce", 77.6, ("P3",)),
    ("alfworld_qwen2p5_7b", "seen_40", "no_is_no_gate", 35.0, ("P3",)),
    ("alfworld_qwen2p5_7b", "unseen_40", "no_is_no_gate", 27.6, ("P3",)),
])
def test_table_numbers_and_sources(paper, experiment, row, arm, value, sources):
    entry = table_value(paper, experiment, row, arm)[0]
    assert (entry.value, entry.sources) == (value, sources)
    assert paper.is_secondary(entry) == all(tag.startswith("P3") for tag in sources)


# Spec §3.3 (paper Tables 9/10 via [P3t]): step -> (AIME24, AIME25, mean) for each arm.
R1_CURVE = {
    "trust": {0: (22.71, 20.63, 21.67), 1024: (28.13, 23.33, 25.73), 2048: (31.98, 26.35, 29.17),
              3072: (32.08, 27.92, 30.00), 3968: (35.42, 26.25, 30.83), 4992: (36.15, 28.33, 32.24),
              5896: (38.85, 28.54, 33.70)},
    "is_only": {0: (22.71, 20.42, 21.56), 1024: (27.60, 24.06, 25.83), 2048: (28.85, 25.63, 27.24),
                3072: (33.13, 26.46, 29.79), 3968: (34.58, 26.77, 30.68), 4992: (33.85, 27.40, 30.63),
                5888: (33.33, 27.81, 30.57)},
}


@pytest.mark.parametrize("arm", sorted(R1_CURVE))
def test_r1_learning_curve_is_complete(paper, arm):
    r1 = paper.experiment("long_horizon_r1_distill_1p5b")
    rows = {row.id: row for row in r1.rows}
    found = {}
    for entry in r1.reported:
        if entry.arm != arm or entry.value is None or "P3t" not in entry.sources:
            continue
        metric = rows[entry.row].metric if entry.row else entry.metric
        step = entry.step if entry.step is not None else rows[entry.row].at.bound
        found[(metric, step)] = entry.value
    expected = {}
    for step, (aime24, aime25, mean) in R1_CURVE[arm].items():
        expected.update({("aime24", step): aime24, ("aime25", step): aime25, ("aime_mean", step): mean})
    assert found == expected
    for aime24, aime25, mean in R1_CURVE[arm].values():  # the transcription is self-consistent
        assert mean == pytest.approx((aime24 + aime25) / 2, abs=0.006)


def test_facts_and_unattributed_ablations_are_kept(paper):
    facts = {(entry.value, entry.unit) for exp in paper.experiments.values() for entry in exp.reported if entry.what}
    for fact in [(6000, "updates"), (256000, "rollouts"), (512000, "rollouts"), (12800, "trajectories"),
                 (6.8, "points"), (1450, "steps"), (36.2, "%"), (3.30, "calls"), (9.8, "%"), (0.477, "reward"),
                 (0.403, "reward"), (17.2, "%"), (45.3, "%"), (4000, "steps")]:
        assert fact in facts, fact
    unattributed = {entry.value for entry in paper.unattributed}
    assert {28.45, 26.80, 2160, 1237, 72, 46} <= unattributed
    assert all(paper.is_secondary(entry) for entry in paper.unattributed)


def _mutated(tmp_path: Path, mutate) -> Path:
    raw = yaml.safe_load(DEFAULT_PATH.read_text())
    raw = copy.deepcopy(raw)
    mutate(raw)
    path = tmp_path / "paper_results.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def _tool(raw):
    return raw["experiments"]["python_tool_qwen2p5_7b"]


@pytest.mark.parametrize("mutate, location, problem", [
    (lambda raw: _tool(raw)["reported"][0].update(sources=["Z"]),
     "experiments.python_tool_qwen2p5_7b.reported[0].sources", "unknown source tag 'Z'"),
    (lambda raw: _tool(raw)["reported"][0].update(value="1e-3"),
     "reported[0].value", "write floats with a dot"),
    (lambda raw: _tool(raw)["reported"][0].update(row="score_601"), "reported[0].row", "unknown row 'score_601'"),
    (lambda raw: _tool(raw)["reported"][0].update(arm="ppo"), "reported[0].arm", "unknown arm 'ppo'"),
    (lambda raw: _tool(raw)["reported"][0].update(what="both"), "reported[0]", "give exactly one of"),
    (lambda raw: _tool(raw)["metrics"]["tool_calls"].update(tag="TOOL_CALS"),
     "metrics.tool_calls.tag", "is not a tag constant of molt_flashreinforce.metrics"),
    (lambda raw: _tool(raw)["rows"][0].update(at={"step": 600, "peak": 600}), "rows[0].at", "expected one of"),
    (lambda raw: _tool(raw)["protocol"].pop("summary"), "python_tool_qwen2p5_7b.protocol", "missing key(s) summary"),
    (lambda raw: _tool(raw)["protocol"].update(avg_at_k=0), "protocol.avg_at_k", "positive integer"),
    (lambda raw: raw["sources"]["R"].update(kind="paper"), "sources.R", "kind must be one of primary, secondary"),
    (lambda raw: _tool(raw).update(default_arm="ppo"), "default_arm", "'ppo' is not one of the arms"),
    (lambda raw: _tool(raw)["plot"].update(x="time"), "plot.x", "must be one of step, rollouts"),
    (lambda raw: raw["unattributed"][0].pop("what") and raw["unattributed"][0].update(row="x"),
     "unattributed[0].row", "unknown row 'x'"),
    (lambda raw: raw.update(schema_version=2), "schema_version", "expected 1"),
    # A name the data recipe does not write (the old ALFWorld copy) is refused, naming the recipe's.
    (lambda raw: raw["experiments"]["alfworld_qwen2p5_7b"]["metrics"]["seen"].update(eval_pass1=["alfworld_seen"]),
     "alfworld_qwen2p5_7b.metrics.seen.eval_pass1",
     "'alfworld_seen' is not an eval datasource of alfworld_qwen2p5_7b's data recipe "
     "(molt_flashreinforce/data/recipes.py), which writes alfworld_valid_seen, alfworld_valid_unseen"),
    (lambda raw: raw["experiments"]["long_horizon_r1_distill_1p5b"]["metrics"]["aime24"].update(
        eval_pass1=["aime_2024"]), "metrics.aime24.eval_pass1", "which writes aime24, aime25"),
    (lambda raw: _tool(raw)["layout"].update(columns=["three_mean", "nope"]), "layout.columns", "unknown metric 'nope'"),
    (lambda raw: _tool(raw)["layout"].update(target="score_601"), "layout.target", "unknown row 'score_601'"),
    (lambda raw: _tool(raw)["protocol"].update(grader="lenient"), "protocol.grader", "'lenient' is not a grader"),
])
def test_malformed_entries_name_location_and_problem(tmp_path, mutate, location, problem):
    path = _mutated(tmp_path, mutate)
    with pytest.raises(PaperResultsError) as error:
        load_paper_results(path)
    message = str(error.value)
    assert str(path) in message and location in message and problem in message


def test_unreadable_files(tmp_path):
    with pytest.raises(PaperResultsError, match="does not exist"):
        load_paper_results(tmp_path / "absent.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("sources: [unclosed\n")
    with pytest.raises(PaperResultsError, match="is not valid YAML"):
        load_paper_results(broken)


def test_cli_reports_a_malformed_file_and_exits_2(tmp_path, capsys):
    path = _mutated(tmp_path, lambda raw: _tool(raw)["reported"][0].update(sources=["Z"]))
    assert main([str(tmp_path), "--paper-results", str(path)]) == 2
    assert "unknown source tag 'Z'" in capsys.readouterr().err
