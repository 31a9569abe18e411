"""``molt-flashreinforce-data``: write an experiment's datasets in Molt's prompt format.

Usage::

    molt-flashreinforce-data EXPERIMENT --out DATA_DIR [--source NAME=FILE_OR_ID ...]

writes ``DATA_DIR/EXPERIMENT/train.jsonl`` and ``eval.jsonl`` (schema.py) and prints the row
count of every datasource. Each source defaults to the Hugging Face id in ``recipes.py``
(needs a network); ``--source dapo=dapo.parquet`` reads a local .jsonl/.json/.parquet file
instead. ALFWorld's source is its data folder (default ``$ALFWORLD_DATA``). A malformed source
row stops the command with its file and row number; nothing is written then. Exit status:
0 on success, 2 on bad input.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter

from molt_flashreinforce.data.alfworld_rows import alfworld_row, list_games
from molt_flashreinforce.data.math_rows import math_row
from molt_flashreinforce.data.recipes import RECIPES, Part
from molt_flashreinforce.data.schema import MalformedRowError, validate_row
from molt_flashreinforce.data.sources import SourceError, read_records
from molt_flashreinforce.data.tiny_rows import tiny_rows


def _source_for(part: Part, overrides: dict[str, str]) -> str:
    if part.source in overrides:
        return overrides[part.source]
    if part.kind == "alfworld":
        root = os.environ.get("ALFWORLD_DATA")
        if not root:
            raise SourceError("ALFWorld data: pass --source alfworld=<dir> or export ALFWORLD_DATA (see alfworld-download).")
        return root
    return part.default


def _math_part_rows(part: Part, source: str) -> tuple[list[dict], str]:
    """Rows of one math part and a note on what was read."""
    hub_id, _, split = part.default.partition(":")
    rows, seen, read = [], set(), 0
    for number, record in read_records(source, default_split=split or "train"):
        read += 1
        problem, row = math_row(record, f"{source} row {number}", part.style, part.datasource, part.by_data_source)
        if part.dedup:
            key = " ".join(problem.split())
            if key in seen:
                continue
            seen.add(key)
        rows.append(row)
        if part.limit is not None and len(rows) == part.limit:
            break
    note = f"{read} read" + (f", {len(seen)} unique kept in order" if part.dedup else "")
    return rows, note


def build_part(part: Part, overrides: dict[str, str]) -> tuple[list[dict], str]:
    if part.kind == "tiny":
        return tiny_rows(part.output), "generated"
    source = _source_for(part, overrides)
    if part.kind == "alfworld":
        games = list_games(source, part.default)
        chosen = games[: part.limit] if part.limit is not None else games
        return [alfworld_row(g, part.datasource) for g in chosen], f"{len(games)} games in {part.default}"
    try:
        rows, note = _math_part_rows(part, source)
    except SourceError as error:
        if part.source in overrides:
            raise
        # The default is a Hugging Face id: name the exact option that replaces it with a local file.
        raise SourceError(f"{error} For this source: --source {part.source}=<file.jsonl|.json|.parquet>.") from None
    return rows, f"{note} from {source}"


def prepare(experiment: str, out_dir: str, overrides: dict[str, str]) -> dict[str, Counter]:
    """Write the experiment's files; returns {file name: rows per datasource}."""
    if experiment not in RECIPES:
        raise SourceError(f"Unknown experiment {experiment!r}; choose one of {', '.join(RECIPES)}.")
    parts = RECIPES[experiment]
    unknown = set(overrides) - {p.source for p in parts}
    if unknown:
        names = ", ".join(sorted({p.source for p in parts}))
        raise SourceError(f"--source {', '.join(sorted(unknown))}: {experiment} has no such source (it reads {names}).")
    outputs: dict[str, list[dict]] = {"train": [], "eval": []}
    for part in parts:
        rows, note = build_part(part, overrides)
        shortfall = f" (fewer than the {part.limit} wanted)" if part.limit and len(rows) < part.limit else ""
        print(f"{part.output}: {part.source} -> {len(rows)} rows{shortfall} [{note}]", file=sys.stderr)
        outputs[part.output].extend(rows)
    label_key = "game_file" if parts[0].kind == "alfworld" else "reward_model"
    for output, rows in outputs.items():
        if not rows:
            raise SourceError(f"{experiment}: {output}.jsonl would be empty; check its sources.")
        for number, row in enumerate(rows, start=1):
            validate_row(row, label_key, f"{output}.jsonl row {number}")
    folder = os.path.join(out_dir, experiment)
    os.makedirs(folder, exist_ok=True)
    counts = {}
    for output, rows in outputs.items():
        path = os.path.join(folder, f"{output}.jsonl")
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
        os.replace(path + ".tmp", path)
        counts[f"{output}.jsonl"] = Counter(row["datasource"] for row in rows)
    return counts


def _parse_overrides(pairs: list[str]) -> dict[str, str]:
    overrides = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name or not value:
            raise SourceError(f"--source {pair!r}: write NAME=FILE_OR_ID, e.g. --source dapo=dapo.parquet.")
        overrides[name] = value
    return overrides


def _epilog() -> str:
    sources = "\n".join(
        f"  {name}: {', '.join(dict.fromkeys(p.source for p in parts if p.kind != 'tiny')) or '(generated)'}"
        for name, parts in sorted(RECIPES.items())
    )
    return (
        "Each source defaults to its Hugging Face id (needs a network); --source NAME=FILE reads a local\n"
        ".jsonl, .json or .parquet file instead (ALFWorld: its data folder, default $ALFWORLD_DATA).\n"
        f"Sources per experiment:\n{sources}\n"
        "Example: molt-flashreinforce-data math_qwen2p5_1p5b --out data --source dapo=dapo.parquet\n"
        "Exit status: 0 on success, 2 on bad input (a malformed row names its file and row; nothing is written)."
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="molt-flashreinforce-data", formatter_class=argparse.RawDescriptionHelpFormatter, epilog=_epilog(),
        description="Write an experiment's datasets in Molt's prompt format: OUT/EXPERIMENT/train.jsonl and eval.jsonl.",
    )
    parser.add_argument("experiment", choices=sorted(RECIPES))
    parser.add_argument("--out", required=True, help="data directory; files go to OUT/EXPERIMENT/")
    parser.add_argument(
        "--source", action="append", default=[], metavar="NAME=FILE_OR_ID",
        help="read source NAME from a local .jsonl/.json/.parquet file, a Hugging Face id, or (alfworld) a folder",
    )
    args = parser.parse_args(argv)
    try:
        counts = prepare(args.experiment, args.out, _parse_overrides(args.source))
    except (SourceError, MalformedRowError) as exc:
        print(f"molt-flashreinforce-data: error: {exc}", file=sys.stderr)
        return 2
    for name, per_source in counts.items():
        print(f"{os.path.join(args.out, args.experiment, name)}: {sum(per_source.values())} rows")
        for datasource, n in sorted(per_source.items()):
            print(f"  {datasource}: {n}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
