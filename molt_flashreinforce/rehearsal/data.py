"""The rehearsal's data: raw sources in the formats the real ones have, converted by the same
`molt-flashreinforce-data` recipe a GPU run uses (`data.cli.prepare`).

    prepare_rehearsal_data(experiment, out_dir, train_rows) -> (data_dir, env)

Math sources are generated problems with one-digit answers, written as DAPO-Math-17k records (the math, tool
and MoE recipes read them as `dapo`), as each eval benchmark's records (problems of their own per benchmark:
Molt tells an eval row's benchmark by its prompt text) and as Sanity-Test records (R1), whose test split
carries the real `data_source` values, so that every eval tag has its benchmark's real name.
ALFWorld's source is a folder of locally written real TextWorld games (`alfworld_games`);
`env` then holds the ALFWORLD_DATA the agent needs on every worker.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

from molt_flashreinforce.data.cli import prepare
from molt_flashreinforce.data.recipes import RECIPES, SANITY_TEST_BENCHMARKS
from molt_flashreinforce.rehearsal.alfworld_games import rehearsal_games, write_games

EVAL_ROWS = 2
_DAPO_PROMPT = (
    "Solve the following math problem step by step. The last line of your response should be of the form "
    "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n{problem}\n\n"
    'Remember to put your answer on its own line after "Answer:".'
)


_SANITY_SUFFIX = " Let's think step by step and output the final answer within \\boxed{}."
PROMPT_TEXTS = (_DAPO_PROMPT, _SANITY_SUFFIX)  # fixed texts the tiny tokenizer knows as words


def _problems(count: int) -> list[tuple[str, str]]:
    """Distinct one-digit-answer problems (sums, differences, products), so a random policy's
    boxed digit is right about one time in ten."""
    problems = [(f"What is ${a}+{b}$?", a + b) for a in range(10) for b in range(10) if a + b <= 9]
    problems += [(f"What is ${a}-{b}$?", a - b) for a in range(10) for b in range(10) if a > b]
    problems += [(f"What is ${a}\\times{b}$?", a * b) for a in range(2, 10) for b in range(2, 10) if a * b <= 9]
    if count > len(problems):
        raise ValueError(f"at most {len(problems)} distinct rehearsal problems, asked for {count}")
    return [(text, str(answer)) for text, answer in problems[:count]]


def _write_jsonl(path: Path, records: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")


def _math_sources(root: Path, train_rows: int) -> dict[str, str]:
    benchmarks = [part.source for part in RECIPES["math_qwen2p5_1p5b"] if part.output == "eval"]
    test_names = [value for value, _ in SANITY_TEST_BENCHMARKS]
    problems = _problems(max(train_rows, EVAL_ROWS * max(len(benchmarks), len(test_names))))
    dapo = root / "dapo.jsonl"
    _write_jsonl(dapo, [
        {"data_source": "math_dapo", "prompt": [{"role": "user", "content": _DAPO_PROMPT.format(problem=p)}],
         "ability": "MATH", "reward_model": {"ground_truth": a, "style": "rule-lean"}}
        for p, a in problems[:train_rows]
    ])
    sources = {"dapo": str(dapo)}
    for index, name in enumerate(benchmarks):
        path = root / f"{name}.jsonl"
        _write_jsonl(path, [{"problem": p, "answer": a} for p, a in problems[index * EVAL_ROWS:(index + 1) * EVAL_ROWS]])
        sources[name] = str(path)

    def sanity(pairs, data_source):
        return [{"data_source": data_source, "prompt": [{"role": "user", "content": p + _SANITY_SUFFIX}],
                 "reward_model": {"ground_truth": a}} for p, a in pairs]

    sanity_train, sanity_test = root / "sanity_train.jsonl", root / "sanity_test.jsonl"
    _write_jsonl(sanity_train, sanity(problems[:train_rows], "math"))
    _write_jsonl(sanity_test, [row for index, name in enumerate(test_names)
                               for row in sanity(problems[index * EVAL_ROWS:(index + 1) * EVAL_ROWS], name)])
    return {**sources, "sanity_train": str(sanity_train), "sanity_test": str(sanity_test)}


def prepare_rehearsal_data(experiment: str, out_dir: Path, train_rows: int) -> tuple[Path, dict[str, str]]:
    """Write `<out_dir>/data/<experiment>/{train,eval}.jsonl`; returns the data dir and the env it needs."""
    sources_dir = out_dir / "sources"
    sources_dir.mkdir(parents=True, exist_ok=True)
    env: dict[str, str] = {}
    if experiment.startswith("alfworld"):
        games_root = sources_dir / "alfworld"
        write_games(str(games_root), rehearsal_games(train_rows))
        sources = {"alfworld": str(games_root)}
        env["ALFWORLD_DATA"] = str(games_root)
    else:
        sources = _math_sources(sources_dir, train_rows)
    wanted = {part.source for part in RECIPES[experiment]}
    data_dir = out_dir / "data"
    with contextlib.redirect_stderr(io.StringIO()):  # the per-part counts; the summary reports rows
        prepare(experiment, str(data_dir), {k: v for k, v in sources.items() if k in wanted})
    return data_dir, env
