"""Fill the measured numbers in the docs from the files the measuring scripts write.

    python scripts/doc_numbers.py            # rewrite README.md, docs/*.md, experiments/**/*.md in place
    python scripts/doc_numbers.py --check    # exit 1 and list every stale marker (tests/test_doc_numbers.py)

A marker holds its rendered value between an opening and a closing comment, so the docs read normally:

    <!-- num:tiny/arms/grpo_g4_lag0/end/mean|.3f -->0.400<!-- /num -->
    <!-- code:fresh/job_printed -->             (a fenced block: one line per list item)
    <!-- include:experiments/tiny/report_lag0_seed0.md -->   (a file's text, verbatim)

A key is `<source>/<path>`: the source names one JSON file (SOURCES), the path walks into it. A
`num` key may end in `|[transform|]format`: `format` is a Python format spec; the transforms are
`pct` (x 100), `excess_pct` ((x - 1) x 100) and `min_s` (seconds as "M min S s", no format).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SOURCES = {
    "fresh": "experiments/fresh_machine/result.json",  # experiments/fresh_machine/measure.py
    "tiny": "experiments/tiny/results.json",  # experiments/tiny/compare.py (summarize.py)
    "loss": "experiments/benchmarks/loss.json",  # benchmarks/bench_loss.py --json
    "loss1": "experiments/benchmarks/loss_1thread.json",  # the same with OMP_NUM_THREADS=1
    "local": "experiments/benchmarks/local.json",  # benchmarks/bench_local.py --json
    "grading": "experiments/benchmarks/grading.json",  # benchmarks/bench_grading.py
    "fused": "experiments/benchmarks/fused_head.json",  # benchmarks/bench_training_step.py --vocab 8192
    "step": "experiments/bench_training_step.json",  # benchmarks/bench_training_step.py
    "step_before": "experiments/bench_training_step_before.json",  # the same, before the slab entropies
    "step12k": "experiments/bench_training_step_12288.json",  # the same at 12,288 tokens
    "step16k": "experiments/bench_training_step_16384.json",  # the same at 16,384 tokens
    "step16kt": "experiments/bench_training_step_16384_time.json",  # the same, step time at 16,384 tokens
    "rehearsal": "experiments/rehearsal/results.json",  # experiments/rehearsal/collect.py
    "mismatch": "experiments/benchmarks/engine_mismatch.json",  # benchmarks/bench_engine_mismatch.py
    "device": "experiments/device/cuda.json",  # scripts/device_check.sh on one H200
    "device_perturbed": "experiments/device/cuda-perturbed.json",  # the same with --perturb 0.02
    "device_chunks": "experiments/device/cuda-head-chunk-sweep.json",  # --parts head with its chunk sweep
    "device_chunk26": "experiments/device/cuda-head-chunk-67108864.json",  # a run with 2^26 as the default
}
MARKER = re.compile(r"<!-- (num|code|include):(\S+?) -->(.*?)<!-- /\1 -->", re.DOTALL)


class StaleKeyError(KeyError):
    """A marker names a source, a path or a transform that does not exist."""


def documents(root: Path = REPO) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").glob("*.md")), *sorted((root / "experiments").rglob("*.md"))]


def _lookup(key: str, root: Path, cache: dict[str, object]) -> object:
    source, _, path = key.partition("/")
    if source not in SOURCES:
        raise StaleKeyError(f"{key}: unknown source {source!r}; sources: {', '.join(SOURCES)}")
    if source not in cache:
        cache[source] = json.loads((root / SOURCES[source]).read_text(encoding="utf-8"))
    node = cache[source]
    parts = path.split("/") if path else []
    while parts:
        part = parts.pop(0)
        if isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
            continue
        # A JSON key may itself hold a slash (a ratio such as "ours_q09/ours_q1"): take the
        # shortest run of parts that names a key.
        while isinstance(node, dict) and part not in node and parts:
            part += "/" + parts.pop(0)
        if not (isinstance(node, dict) and part in node):
            raise StaleKeyError(f"{key}: {SOURCES[source]} has no {part!r} there")
        node = node[part]
    return node


TRANSFORMS = {
    "pct": lambda x: x * 100,
    "excess_pct": lambda x: (x - 1) * 100,
}


def _minutes(seconds: float) -> str:
    minutes, seconds = divmod(round(seconds), 60)
    return f"{minutes} min {seconds} s" if minutes else f"{seconds} s"


def _number(spec: str, root: Path, cache: dict[str, object]) -> str:
    key, *formatting = spec.split("|")
    value = _lookup(key, root, cache)
    if formatting[:1] == ["min_s"]:
        return _minutes(value)
    if formatting and formatting[0] in TRANSFORMS:
        value = TRANSFORMS[formatting.pop(0)](value)
    if len(formatting) > 1:
        raise StaleKeyError(f"{spec}: write key|format or key|transform|format ({', '.join(TRANSFORMS)}, min_s)")
    return format(value, formatting[0] if formatting else "")


def render(text: str, root: Path = REPO) -> str:
    """`text` with every marker's content recomputed from the sources."""
    cache: dict[str, object] = {}

    def fill(match: re.Match) -> str:
        kind, spec, _ = match.groups()
        if kind == "num":
            body = _number(spec, root, cache)
        elif kind == "code":
            lines = _lookup(spec, root, cache)
            body = "\n```\n" + "\n".join(map(str, lines)) + "\n```\n"
        else:
            body = "\n" + (root / spec).read_text(encoding="utf-8").rstrip("\n") + "\n"
        return f"<!-- {kind}:{spec} -->{body}<!-- /{kind} -->"

    return MARKER.sub(fill, text)


def stale(path: Path, root: Path = REPO) -> list[str]:
    """The markers of `path` whose content differs from what the sources say now."""
    text = path.read_text(encoding="utf-8")
    rendered = {m.group(0) for m in MARKER.finditer(render(text, root))}
    return [m.group(0) for m in MARKER.finditer(text) if m.group(0) not in rendered]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if any marker is stale")
    args = parser.parse_args()
    problems = 0
    for path in documents():
        if args.check:
            for marker in stale(path):
                problems += 1
                print(f"{path.relative_to(REPO)}: stale: {marker[:160]}", file=sys.stderr)
        else:
            text = path.read_text(encoding="utf-8")
            rendered = render(text)
            if rendered != text:
                path.write_text(rendered, encoding="utf-8")
                print(f"updated {path.relative_to(REPO)}")
    if problems:
        print(f"{problems} stale marker(s); run: python scripts/doc_numbers.py", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
