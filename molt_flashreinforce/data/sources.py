"""Read source records from a local file or, where a network exists, a Hugging Face dataset.

``read_records(source)`` yields ``(row_number, record)`` with 1-based row numbers:

* a local ``.jsonl`` (one JSON object per line; blank lines skipped), ``.json`` (a list of
  objects) or ``.parquet`` file (needs pyarrow, in the ``data`` extra);
* otherwise a Hugging Face dataset id, ``org/name`` or ``org/name:split`` (needs ``datasets``,
  in the ``data`` extra, and a network; the split defaults to the one the recipe names).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

from molt_flashreinforce.data.schema import MalformedRowError

LOCAL_SUFFIXES = (".jsonl", ".json", ".parquet")


class SourceError(RuntimeError):
    """A source that cannot be read at all."""


def read_records(source: str, default_split: str = "train") -> Iterator[tuple[int, dict]]:
    if source.endswith(LOCAL_SUFFIXES) or os.path.exists(source):
        yield from _read_local(source)
    else:
        yield from _read_hub(source, default_split)


def _read_local(path: str) -> Iterator[tuple[int, dict]]:
    if not os.path.isfile(path):
        raise SourceError(f"{path} does not exist (a local source must be a .jsonl, .json or .parquet file).")
    if path.endswith(".jsonl"):
        with open(path, encoding="utf-8") as f:
            for number, line in enumerate(f, start=1):
                if line.strip():
                    yield number, _object(_json(line, f"{path} row {number}"), f"{path} row {number}")
    elif path.endswith(".json"):
        with open(path, encoding="utf-8") as f:
            rows = _json(f.read(), path)
        if not isinstance(rows, list):
            raise MalformedRowError(f"{path}: a .json source must hold a list of row objects")
        for number, row in enumerate(rows, start=1):
            yield number, _object(row, f"{path} row {number}")
    elif path.endswith(".parquet"):
        try:
            import pyarrow.parquet as pq
        except ImportError as exc:
            raise SourceError("Reading Parquet needs pyarrow: pip install 'molt-flashreinforce[data]'.") from exc
        number = 0
        for batch in pq.ParquetFile(path).iter_batches():
            for row in batch.to_pylist():
                number += 1
                yield number, row
    else:
        raise SourceError(f"{path}: unsupported file type; use .jsonl, .json or .parquet.")


def _json(text: str, where: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise MalformedRowError(f"{where}: not valid JSON ({exc.msg} at character {exc.pos})") from None


def _object(row, where: str) -> dict:
    if not isinstance(row, dict):
        raise MalformedRowError(f"{where}: expected a JSON object, got {type(row).__name__}")
    return row


def _read_hub(dataset_id: str, default_split: str) -> Iterator[tuple[int, dict]]:
    name, _, split = dataset_id.partition(":")
    try:
        import datasets
    except ImportError as exc:
        raise SourceError(
            f"{dataset_id} is not a local file, and loading Hugging Face datasets needs the datasets package: "
            "pip install 'molt-flashreinforce[data]'."
        ) from exc
    try:
        dataset = datasets.load_dataset(name, split=split or default_split)
    except Exception as exc:  # noqa: BLE001 - offline, missing or gated: the fix is the same
        raise SourceError(
            f"Could not load the Hugging Face dataset {name!r} (split {split or default_split!r}): {exc}. "
            f"Without a network, download it elsewhere and pass it as a local file with --source."
        ) from exc
    for number, row in enumerate(dataset, start=1):
        yield number, row
