"""What each experiment's train and eval files are made of.

Each ``Part`` names a source (overridable on the command line with ``--source NAME=FILE_OR_ID``),
its default Hugging Face id, how to convert it and how many rows to keep. The paper names only
DAPO-Math-17k and ``sail/Sanity-Test-R1D-1.5B``; the other ids are common public copies of the
benchmarks, chosen here (the paper's copies are unknown; see docs/agents.md).

Each eval part names its benchmark's ``datasource`` here and only here: Molt logs it as
``eval/eval_<datasource>_pass1``, and the report's metrics (report/paper_results.yaml) are checked
against ``eval_datasources(experiment)`` when that file is loaded.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Part:
    output: str  # "train" or "eval"
    source: str  # the --source name
    default: str  # Hugging Face id[:split]; for ALFWorld the split folder; for tiny unused
    kind: str  # "math", "alfworld" or "tiny"
    # The rows' datasource; None: each record's own `data_source`, renamed by `by_data_source`
    datasource: str | None
    style: str = "boxed"
    limit: int | None = None
    dedup: bool = False
    by_data_source: tuple[tuple[str, str], ...] = ()  # (record's data_source, datasource) pairs

    def datasources(self) -> tuple[str, ...]:
        return (self.datasource,) if self.datasource is not None else tuple(name for _, name in self.by_data_source)


DAPO = "BytedTsinghua-SIA/DAPO-Math-17k:train"
# The Sanity-Test test split holds AIME 2024 and AIME 2025, told apart by each record's
# `data_source`: "aime_2024" and "aime_2025". Where that comes from: Molt's own converter for this
# dataset (labs-molt examples/python/utils/prepare_dapo.py, which names it in its docstring) copies
# `data_source` verbatim into `datasource`, Molt logs that name unchanged
# (molt/trainer/rl_trainer.py, compute_eval_metrics), and published R1 runs of Molt on this split
# log `eval_aime_2024_pass1` and `eval_aime_2025_pass1`.
SANITY_TEST_BENCHMARKS = (("aime_2024", "aime24"), ("aime_2025", "aime25"))
EVAL_IDS = {
    "math500": "HuggingFaceH4/MATH-500:test",
    "amc23": "math-ai/amc23:test",
    "minerva": "math-ai/minervamath:test",
    "aime25": "math-ai/aime25:test",
    "olympiadbench": "math-ai/olympiadbench:test",
}


def _math_eval(names, style):
    return [Part("eval", name, EVAL_IDS[name], "math", name, style) for name in names]


def _tool_recipe():
    # Tool-formatted DAPO prompts; online eval on AMC23, Minerva and AIME25 with the same agent.
    return [
        Part("train", "dapo", DAPO, "math", "dapo_math", "python_tool", limit=7500, dedup=True),
        *_math_eval(["amc23", "minerva", "aime25"], "python_tool"),
    ]


RECIPES: dict[str, list[Part]] = {
    "math_qwen2p5_1p5b": [
        Part("train", "dapo", DAPO, "math", "dapo_math", limit=7500, dedup=True),
        *_math_eval(["math500", "amc23", "minerva", "aime25", "olympiadbench"], "boxed"),
    ],
    "python_tool_qwen2p5_7b": _tool_recipe(),
    "moe_lag8_qwen3_30b_a3b": _tool_recipe(),
    "alfworld_qwen2p5_7b": [
        Part("train", "alfworld", "train", "alfworld", "alfworld_train", limit=1024),
        Part("eval", "alfworld", "valid_seen", "alfworld", "alfworld_valid_seen", limit=140),
        Part("eval", "alfworld", "valid_unseen", "alfworld", "alfworld_valid_unseen", limit=134),
    ],
    "long_horizon_r1_distill_1p5b": [
        Part("train", "sanity_train", "sail/Sanity-Test-R1D-1.5B:train", "math", "sanity_r1d", limit=1460),
        Part("eval", "sanity_test", "sail/Sanity-Test-R1D-1.5B:test", "math", None,
             by_data_source=SANITY_TEST_BENCHMARKS),
    ],
    "tiny": [
        Part("train", "tiny", "generated", "tiny", "tiny"),
        Part("eval", "tiny", "generated", "tiny", "tiny"),
    ],
}


def eval_datasources(experiment: str) -> tuple[str, ...]:
    """The datasource names of the experiment's eval rows, in recipe order (its eval tags' names)."""
    return tuple(name for part in RECIPES[experiment] if part.output == "eval" for name in part.datasources())
