"""A model's context window, read without the network, and a copy of a model whose config allows more.

Molt hands `--data.max_len` to vLLM as `max_model_len`, and vLLM refuses a length beyond the
model config's `max_position_embeddings`. Molt 0.2.1 has no flag or environment variable that
passes a model-config override (vLLM's `hf_overrides`) to its engines or to transformers, and
vLLM's `VLLM_ALLOW_LONG_MAX_MODEL_LEN=1` only lifts that check: the rotary tables stay at the
config's length, so positions past it index out of range. The paper's Qwen2.5-Math setting
instead requires a model configuration that supports the longer context, so a run with
`model.max_position_embeddings` set trains a copy of the model whose config.json says so (every
other file is a link to the original).

- `config_max_positions(name_or_path)`: `max_position_embeddings` of the model's own config.json
  (a local directory, or the Hugging Face cache, offline), or None when neither is readable.
- `native_max_positions(name_or_path)`: that, else the shape card's value; with where it came from.
- `extended_copy_path(cfg)`: the directory Molt is given when `model.max_position_embeddings` is
  set (`<model.dir>/<name>-ctx<N>`), else None.
- `write_extended_copy(source, max_positions, out_dir)`: writes that copy.
- `python -m molt_flashreinforce.launch.model_context MODEL --max-position-embeddings N --out DIR`.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path, PurePath
from typing import Any

from molt_flashreinforce import modelcards

CONFIG_FILE = "config.json"
CONTEXT_KEY = "max_position_embeddings"


def _positions(config: dict[str, Any]) -> int | None:
    # Multimodal configs keep the language model's context under text_config.
    for node in (config, config.get("text_config") or {}):
        if isinstance(node.get(CONTEXT_KEY), int):
            return node[CONTEXT_KEY]
    return None


def _config_file(name_or_path: str) -> Path | None:
    local = Path(name_or_path).expanduser()
    if local.is_dir():
        return local / CONFIG_FILE if (local / CONFIG_FILE).is_file() else None
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    try:
        cached = try_to_load_from_cache(name_or_path, CONFIG_FILE)
    except ValueError:  # not a repository id
        return None
    return Path(cached) if isinstance(cached, str) else None


def config_max_positions(name_or_path: str) -> int | None:
    path = _config_file(name_or_path)
    if path is None:
        return None
    return _positions(json.loads(path.read_text(encoding="utf-8")))


def native_max_positions(name_or_path: str) -> tuple[int | None, str]:
    """(positions, where they were read), (None, reason) when no source knows the model."""
    positions = config_max_positions(name_or_path)
    if positions is not None:
        return positions, f"{name_or_path}'s config.json"
    positions = modelcards.max_positions(name_or_path)
    if positions is not None:
        return positions, f"the shape card of {name_or_path}"
    return None, f"no readable config.json or shape card for {name_or_path}"


def extended_copy_path(cfg: Any) -> Path | None:
    positions = cfg.model.get("max_position_embeddings")
    if positions is None:
        return None
    name = PurePath(str(cfg.model.name_or_path)).name
    return Path(str(cfg.model.dir)) / f"{name}-ctx{int(positions)}"


def _source_directory(source: str) -> Path:
    local = Path(source).expanduser()
    if local.is_dir():
        return local
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(source))


def write_extended_copy(source: str, max_positions: int, out_dir: Path) -> Path:
    """`out_dir` holds links to every file of `source` and a config.json with the new context."""
    source_dir = _source_directory(source)
    config = json.loads((source_dir / CONFIG_FILE).read_text(encoding="utf-8"))
    native = _positions(config)
    if native is None:
        raise ValueError(f"{source}'s config.json has no {CONTEXT_KEY}; its context cannot be raised here")
    if max_positions < native:
        raise ValueError(f"--max-position-embeddings {max_positions} is below {source}'s own {native}; "
                         "use the model as published")
    node = config if CONTEXT_KEY in config else config["text_config"]
    node[CONTEXT_KEY] = max_positions
    out_dir.mkdir(parents=True, exist_ok=True)
    for item in source_dir.iterdir():
        if item.name == CONFIG_FILE:
            continue
        link = out_dir / item.name
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(os.path.realpath(item))
    (out_dir / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    return out_dir


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m molt_flashreinforce.launch.model_context",
        description="Write a copy of a model whose config.json allows a longer context "
                    "(the experiment's model.max_position_embeddings).")
    parser.add_argument("model", help="Hugging Face id (downloaded unless cached) or local directory")
    parser.add_argument("--max-position-embeddings", type=int, required=True)
    parser.add_argument("--out", type=Path, default=Path("models"), help="parent directory (model.dir)")
    args = parser.parse_args(argv)
    name = PurePath(args.model).name
    out = write_extended_copy(args.model, args.max_position_embeddings,
                              args.out / f"{name}-ctx{args.max_position_embeddings}")
    print(out)


if __name__ == "__main__":
    main()
