"""A Molt checkpoint's weights as a Hugging Face model directory that vLLM loads.

Contract: ``export_checkpoint(checkpoint, tokenizer, out_dir) -> out_dir``. Molt saves an actor's
weights with NeMo AutoModel's checkpointer into ``<checkpoint>/model/``: DCP shards in Hugging
Face's safetensors layout (HF parameter names, each rank's slices with their offsets), plus the
training config in ``.hf_metadata/``. torch's own ``HuggingFaceStorageReader`` reassembles the
full tensors; they are written with ``huggingface_hub.save_torch_state_dict`` (5 GB shards and an
index), beside that config, its generation config and the base model's tokenizer (the checkpoint
has none). Whole tensors pass through CPU memory: a model's size in RAM.

``EXPORTED`` in ``out_dir`` marks a finished export, naming the checkpoint; a later call for the
same checkpoint returns at once (a resumed eval), one for another checkpoint refuses.
"""

from __future__ import annotations

import json
import os
import shutil
import warnings
from pathlib import Path

EXPORTED = "exported_from.json"


class ExportError(RuntimeError):
    """A checkpoint that cannot be exported, or a directory that holds another export."""


def export_checkpoint(checkpoint: Path, tokenizer, out_dir: Path) -> Path:
    marker = out_dir / EXPORTED
    if marker.is_file():
        exported = json.loads(marker.read_text(encoding="utf-8"))["checkpoint"]
        if exported != str(checkpoint):
            raise ExportError(f"{out_dir} holds the export of {exported}, not of {checkpoint}; use another --out")
        return out_dir
    import torch
    import torch.distributed.checkpoint as dcp
    from huggingface_hub import save_torch_state_dict
    from torch.distributed.checkpoint import HuggingFaceStorageReader

    weights = checkpoint / "model"
    metadata_dir = weights / ".hf_metadata"
    if not (metadata_dir / "config.json").is_file():
        raise ExportError(f"{weights} has no .hf_metadata/config.json: not a checkpoint written by Molt's "
                          "AutoModel checkpointer")
    layout = HuggingFaceStorageReader(str(weights)).read_metadata().state_dict_metadata
    state = {name: torch.empty(meta.size, dtype=meta.properties.dtype) for name, meta in layout.items()}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*assuming the intent is to load in a single process.*")
        dcp.load(state, storage_reader=HuggingFaceStorageReader(str(weights)), no_dist=True)
    if out_dir.exists():
        shutil.rmtree(out_dir)  # an export cut off before its marker
    out_dir.mkdir(parents=True)
    save_torch_state_dict(state, str(out_dir))
    for name in ("config.json", "generation_config.json"):
        if (metadata_dir / name).is_file():
            shutil.copy(metadata_dir / name, out_dir / name)
    tokenizer.save_pretrained(str(out_dir))
    temporary = marker.with_suffix(".tmp")
    temporary.write_text(json.dumps({"checkpoint": str(checkpoint)}) + "\n", encoding="utf-8")
    os.replace(temporary, marker)
    return out_dir
