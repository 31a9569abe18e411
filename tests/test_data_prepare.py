"""The data command on small shipped fixtures (no network here: every source is a local file).

tests/fixtures/data holds a few rows in the layouts of the public sources (DAPO-Math-17k with
duplicates, MATH-500 as Parquet, AMC23 as a JSON list, OlympiadBench's list answers, the
Sanity-Test splits); ALFWorld uses the hand-made games of tests/fixtures/agents/alfworld_data.
Written files are checked with this package's validator and loaded the way Molt loads them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from molt_flashreinforce.agents.alfworld_game import resolve_game_file
from molt_flashreinforce.agents.alfworld_protocol import game_prompt
from molt_flashreinforce.agents.labels import ground_truth
from molt_flashreinforce.agents.python_tool_protocol import SYSTEM_PROMPT
from molt_flashreinforce.data.cli import _math_part_rows, main
from molt_flashreinforce.data.math_rows import BOXED_INSTRUCTION
from molt_flashreinforce.data.recipes import Part, eval_datasources
from molt_flashreinforce.data.schema import MalformedRowError, validate_row
from molt_flashreinforce.data.tiny_rows import TINY_CONFIG

FIXTURES = Path(__file__).parent / "fixtures" / "data"
ALFWORLD = Path(__file__).parent / "fixtures" / "agents" / "alfworld_data"
MATH_SOURCES = [
    f"dapo={FIXTURES / 'dapo.jsonl'}",
    f"math500={FIXTURES / 'math500.parquet'}",
    f"amc23={FIXTURES / 'amc23.json'}",
    f"minerva={FIXTURES / 'minerva.jsonl'}",
    f"aime25={FIXTURES / 'aime25.jsonl'}",
    f"olympiadbench={FIXTURES / 'olympiadbench.jsonl'}",
]


def run(experiment, out, sources, capsys):
    argv = [experiment, "--out", str(out)]
    for source in sources:
        argv += ["--source", source]
    status = main(argv)
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def read_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def load_like_molt(path: Path):
    """Molt's blending_datasets reads a .jsonl with datasets' "json" builder."""
    datasets = pytest.importorskip("datasets", reason="pip install 'molt-flashreinforce[data]'")
    return datasets.load_dataset("json", data_files=str(path))["train"]


def test_math_experiment_from_local_files(tmp_path, capsys):
    status, out, err = run("math_qwen2p5_1p5b", tmp_path, MATH_SOURCES, capsys)
    assert status == 0, err
    folder = tmp_path / "math_qwen2p5_1p5b"
    train, evaluation = read_rows(folder / "train.jsonl"), read_rows(folder / "eval.jsonl")
    # 7 DAPO rows, two of them repeats: 5 unique problems, first occurrence kept.
    assert [r["reward_model"]["ground_truth"] for r in train] == ["2", "11", "81", "6", "\\frac{3}{2}"]
    assert train[0]["prompt"] == [{"role": "user", "content": f"What is $1+1$?\n\n{BOXED_INSTRUCTION}"}]
    assert {r["datasource"] for r in train} == {"dapo_math"}
    by_source = {}
    for row in evaluation:
        by_source.setdefault(row["datasource"], []).append(row["reward_model"]["ground_truth"])
    assert by_source == {
        "math500": ["\\left( 3, \\frac{\\pi}{2} \\right)", "4"],
        "amc23": ["58.0", "1024"],
        "minerva": ["2.48", "42"],
        "aime25": ["70"],
        "olympiadbench": ["\\frac{1}{2}", "2, -2"],
    }
    assert f"{folder / 'train.jsonl'}: 5 rows\n  dapo_math: 5\n" in out
    assert "  aime25: 1\n  amc23: 2\n  math500: 2\n  minerva: 2\n  olympiadbench: 2\n" in out
    assert "train: dapo -> 5 rows (fewer than the 7500 wanted) [7 read, 5 unique kept in order" in err
    for name in ("train.jsonl", "eval.jsonl"):
        loaded = load_like_molt(folder / name)
        assert loaded.column_names == ["prompt", "reward_model", "datasource"]
        assert all(ground_truth(label) for label in loaded["reward_model"])


def test_olympiad_multi_answers_keep_each_answer_without_dollars():
    rows, _ = _math_part_rows(Part("eval", "o", "x:test", "math", "olympiadbench"), str(FIXTURES / "olympiadbench.jsonl"))
    assert rows[1]["reward_model"]["ground_truth"] == "2, -2"
    assert rows[0]["reward_model"]["ground_truth"] == "\\frac{1}{2}"


def test_dedup_and_limit_keep_the_first_unique_problems():
    part = Part("train", "dapo", "x:train", "math", "dapo_math", limit=3, dedup=True)
    rows, note = _math_part_rows(part, str(FIXTURES / "dapo.jsonl"))
    assert [r["reward_model"]["ground_truth"] for r in rows] == ["2", "11", "81"]
    assert note == "3 read, 3 unique kept in order"


def test_tool_experiments_carry_the_tool_system_prompt(tmp_path, capsys):
    sources = [s for s in MATH_SOURCES if s.split("=")[0] in ("dapo", "amc23", "minerva", "aime25")]
    for experiment in ("python_tool_qwen2p5_7b", "moe_lag8_qwen3_30b_a3b"):
        status, out, err = run(experiment, tmp_path, sources, capsys)
        assert status == 0, err
        train = read_rows(tmp_path / experiment / "train.jsonl")
        evaluation = read_rows(tmp_path / experiment / "eval.jsonl")
        assert train[0]["prompt"] == [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": "What is $1+1$?"},
        ]
        assert {r["datasource"] for r in evaluation} == {"amc23", "minerva", "aime25"}
        assert all(r["prompt"][0]["content"] == SYSTEM_PROMPT for r in train + evaluation)


def test_long_horizon_names_aime24_and_aime25_from_each_records_data_source(tmp_path, capsys):
    sources = [f"sanity_train={FIXTURES / 'sanity_train.jsonl'}", f"sanity_test={FIXTURES / 'sanity_test.jsonl'}"]
    status, out, err = run("long_horizon_r1_distill_1p5b", tmp_path, sources, capsys)
    assert status == 0, err
    folder = tmp_path / "long_horizon_r1_distill_1p5b"
    train = read_rows(folder / "train.jsonl")
    # The source already asks for \boxed{}: no second instruction.
    assert train[1]["prompt"][0]["content"].count("\\boxed") == 1 and BOXED_INSTRUCTION not in train[1]["prompt"][0]["content"]
    evaluation = read_rows(folder / "eval.jsonl")
    # The test split's data_source values aime_2024 / aime_2025 become the recipe's names.
    assert [(r["datasource"], r["reward_model"]["ground_truth"]) for r in evaluation] == [
        ("aime24", "204"), ("aime24", "25"), ("aime25", "70"), ("aime25", "588"), ("aime25", "16")]
    assert "  aime24: 2\n  aime25: 3\n" in out


def test_long_horizon_refuses_an_unknown_data_source_before_writing(tmp_path, capsys):
    odd = tmp_path / "sanity_test.jsonl"
    odd.write_text((FIXTURES / "sanity_test.jsonl").read_text().replace('"aime_2025"', '"AIME 2025"', 1))
    sources = [f"sanity_train={FIXTURES / 'sanity_train.jsonl'}", f"sanity_test={odd}"]
    status, _, err = run("long_horizon_r1_distill_1p5b", tmp_path / "out", sources, capsys)
    assert status == 2
    (line,) = err.strip().splitlines()[-1:]
    assert (f"{odd} row 3: data_source 'AIME 2025' is not a benchmark of this source; known: "
            "'aime_2024' (-> aime24), 'aime_2025' (-> aime25)") in line
    assert not (tmp_path / "out" / "long_horizon_r1_distill_1p5b").exists()


def test_alfworld_game_lists(tmp_path, capsys, monkeypatch):
    status, out, err = run("alfworld_qwen2p5_7b", tmp_path, [f"alfworld={ALFWORLD}"], capsys)
    assert status == 0, err
    train = read_rows(tmp_path / "alfworld_qwen2p5_7b" / "train.jsonl")
    evaluation = read_rows(tmp_path / "alfworld_qwen2p5_7b" / "eval.jsonl")
    assert [r["game_file"] for r in train] == [
        "json_2.1.1/train/pick_and_place_simple-Apple-None-Fridge-1/trial_T1/game.tw-pddl"
    ]
    assert [r["datasource"] for r in evaluation] == list(eval_datasources("alfworld_qwen2p5_7b"))
    assert eval_datasources("alfworld_qwen2p5_7b") == ("alfworld_valid_seen", "alfworld_valid_unseen")
    assert "train: alfworld -> 1 rows (fewer than the 1024 wanted)" in err
    monkeypatch.setenv("ALFWORLD_DATA", str(ALFWORLD))
    for row in train + evaluation:
        assert Path(resolve_game_file(row["game_file"])).is_file()
        # Each game's prompt is its own text (Molt attributes eval samples to datasources by prompt text).
        assert row["prompt"][-1]["content"] == game_prompt(row["game_file"])
        assert "{{alfworld_observation}}" in row["prompt"][-1]["content"]


def test_alfworld_without_data_says_where_to_get_it(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("ALFWORLD_DATA", raising=False)
    status, _, err = run("alfworld_qwen2p5_7b", tmp_path, [], capsys)
    assert status == 2 and "export ALFWORLD_DATA" in err
    status, _, err = run("alfworld_qwen2p5_7b", tmp_path, [f"alfworld={tmp_path}"], capsys)
    assert status == 2 and "json_2.1.1/train does not exist" in err


def test_tiny_matches_the_local_task_split(tmp_path, capsys):
    status, out, err = run("tiny", tmp_path, [], capsys)
    assert status == 0, err
    train = read_rows(tmp_path / "tiny" / "train.jsonl")
    evaluation = read_rows(tmp_path / "tiny" / "eval.jsonl")
    task = OmegaConf.load(TINY_CONFIG).local.task
    n = int(task.max_operand) + 1
    assert (len(train), len(evaluation)) == (n * n - int(task.eval_size), int(task.eval_size))
    held_out = {r["prompt"][0]["content"] for r in evaluation}
    assert not held_out & {r["prompt"][0]["content"] for r in train}
    first = evaluation[0]["prompt"][0]["content"]
    a, b = (int(x) for x in first.split("?")[0].removeprefix("What is ").split(" + "))
    assert evaluation[0]["reward_model"]["ground_truth"] == str(a + b)


@pytest.mark.parametrize(
    "source, message",
    [
        ("broken_json.jsonl", "broken_json.jsonl row 3: not valid JSON"),
        ("missing_answer.jsonl", "missing_answer.jsonl row 2: no answer (looked for reward_model.ground_truth, answer"),
        ("amc23.jsonl", "amc23.jsonl does not exist"),
    ],
)
def test_malformed_sources_are_refused_with_the_row_and_nothing_is_written(tmp_path, capsys, source, message):
    sources = [s for s in MATH_SOURCES if not s.startswith("amc23=")] + [f"amc23={FIXTURES / source}"]
    status, out, err = run("math_qwen2p5_1p5b", tmp_path, sources, capsys)
    assert status == 2
    assert message in err
    assert not (tmp_path / "math_qwen2p5_1p5b").exists()


def test_bad_arguments_are_refused(tmp_path, capsys):
    status, _, err = run("math_qwen2p5_1p5b", tmp_path, ["gsm8k=x.jsonl"], capsys)
    assert status == 2 and "--source gsm8k: math_qwen2p5_1p5b has no such source" in err
    status, _, err = run("math_qwen2p5_1p5b", tmp_path, ["dapo"], capsys)
    assert status == 2 and "write NAME=FILE_OR_ID" in err


def test_hub_ids_without_network_point_to_local_files(tmp_path):
    pytest.importorskip("datasets", reason="pip install 'molt-flashreinforce[data]'")
    # A fresh process: huggingface_hub reads the offline switch when it is imported.
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    done = subprocess.run(
        [sys.executable, "-m", "molt_flashreinforce.data.cli", "math_qwen2p5_1p5b", "--out", str(tmp_path)],
        env=env, capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 2
    assert "Could not load the Hugging Face dataset 'BytedTsinghua-SIA/DAPO-Math-17k' (split 'train')" in done.stderr
    assert "pass it as a local file with --source" in done.stderr
    assert "For this source: --source dapo=<file.jsonl|.json|.parquet>." in done.stderr


def test_help_is_plain_text_and_lists_each_experiments_sources():
    done = subprocess.run([sys.executable, "-m", "molt_flashreinforce.data.cli", "--help"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0
    assert "``" not in done.stdout and "::" not in done.stdout  # no reStructuredText markup
    assert "  math_qwen2p5_1p5b: dapo, math500, amc23, minerva, aime25, olympiadbench" in done.stdout
    assert "--source dapo=dapo.parquet" in done.stdout


@pytest.mark.parametrize(
    "row, message",
    [
        ({"prompt": [], "reward_model": {"ground_truth": "1"}, "datasource": "a"}, "'prompt' must be a non-empty list"),
        ({"prompt": [{"role": "user"}], "reward_model": {"ground_truth": "1"}, "datasource": "a"}, "exactly 'role' and 'content'"),
        ({"prompt": [{"role": "bot", "content": "x"}], "reward_model": {"ground_truth": "1"}, "datasource": "a"}, "role 'bot'"),
        ({"prompt": [{"role": "system", "content": "x"}], "reward_model": {"ground_truth": "1"}, "datasource": "a"}, "last prompt message must be the user's"),
        ({"prompt": [{"role": "user", "content": "x"}], "reward_model": {"ground_truth": ""}, "datasource": "a"}, "ground_truth' must be a non-empty string"),
        ({"prompt": [{"role": "user", "content": "x"}], "reward_model": {"ground_truth": "1"}, "datasource": "AIME 24"}, "'datasource' must be lower-case"),
    ],
)
def test_validator_names_the_row_and_the_problem(row, message):
    with pytest.raises(MalformedRowError, match=f"eval.jsonl row 4: .*{message}"):
        validate_row(row, "reward_model", "eval.jsonl row 4")


def test_validator_checks_alfworld_game_files():
    row = {"prompt": [{"role": "user", "content": "x"}], "game_file": "game.json", "datasource": "alfworld_train"}
    with pytest.raises(MalformedRowError, match="row 1: 'game_file' must be the path of an ALFWorld .tw-pddl game"):
        validate_row(row, "game_file", "row 1")
    validate_row({**row, "game_file": "a/game.tw-pddl"}, "game_file", "row 1")
