"""What is evaluated: a Hugging Face id, an HF model directory, or a Molt checkpoint of a run.

Contract: ``resolve_model(spec, step, export_dir) -> ModelSource`` tells them apart without loading
weights; ``check_tokenizer(source, agent_kind)`` loads the tokenizer once it renders the agent's
prompts; ``context_overrides(source, context, cfg)`` gives the model the experiment's context. All
raise ``EvalInputError`` (one line) for what cannot be evaluated. ``spec`` is one of:

* a run directory (``.hydra/`` and Molt's checkpoints under ``ckpt/state/_actor/``): its newest
  complete checkpoint, or the one at ``step``;
* a Molt checkpoint, ``<run>/ckpt/state/_actor/<tag>`` (or its ``model/``): DCP shards of the
  weights (``molt-integration.md`` 5.5); complete once Molt wrote ``extra_state.pt``, whose client
  state holds its ``global_step``. It is exported to ``export_dir`` for vLLM
  (``checkpoint_export``), with the run's base model's tokenizer;
* an HF model directory (``config.json``). As one of a run's exports, ``<run>/exports/step_<N>``
  (``exports.steps``: the steps the paper reports) or ``<run>/ckpt/state/_hf/global_step<N>``
  (Molt's ``--ckpt.save_hf``), its step and run are known; elsewhere it is a base model (step 0)
  unless ``step`` says otherwise;
* anything else that does not exist locally and reads as ``org/name``: a Hugging Face id (step 0
  unless ``step`` says otherwise).
"""

from __future__ import annotations

import json
import re
import warnings
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig

from molt_flashreinforce.eval_record import ModelRef
from molt_flashreinforce.evaluation.inputs import MULTI_TURN_AGENTS, EvalInputError
from molt_flashreinforce.launch.render import CHECKPOINT_SUBDIR, EXPORTS_SUBDIR

ACTOR_DIR = Path(CHECKPOINT_SUBDIR) / "state" / "_actor"
# A run's HF exports and how their directories name the step: <run>/<parent>/<name>.
RUN_EXPORTS = ((Path(EXPORTS_SUBDIR), re.compile(r"^step_(\d+)$")),
               (Path(CHECKPOINT_SUBDIR) / "state" / "_hf", re.compile(r"^global_step(\d+)$")))
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_TAG_STEP = re.compile(r"^(?:best_)?global_step(\d+)$")


@dataclass(frozen=True)
class ModelSource:
    ref: ModelRef  # what eval.json records
    serve: str  # what vLLM loads: an HF id or directory (a checkpoint's export, written by export())
    tokenizer: str  # where the tokenizer comes from
    checkpoint: Path | None = None  # a Molt checkpoint to export to `serve` first

    @property
    def run_dir(self) -> Path | None:
        return Path(self.ref.run_dir) if self.ref.run_dir else None


def _is_run_dir(path: Path) -> bool:
    return (path / ".hydra").is_dir() and (path / ACTOR_DIR).is_dir()


def _is_checkpoint(path: Path) -> bool:
    return (path / "model").is_dir() and path.parent.name == "_actor"


def _checkpoint_step(checkpoint: Path) -> int:
    import torch

    extra = checkpoint / "extra_state.pt"
    if not extra.is_file():
        raise EvalInputError(f"{checkpoint} is an incomplete Molt checkpoint (no extra_state.pt, which Molt writes "
                             "last); evaluate a complete one")
    step = torch.load(extra, map_location="cpu", weights_only=False).get("client_state", {}).get("global_step")
    if not isinstance(step, int):
        raise EvalInputError(f"{extra} records no global_step; evaluate the checkpoint's HF export with --step N")
    return step


def _run_checkpoint(run_dir: Path, step: int | None) -> Path:
    from molt_flashreinforce.launch.job import latest_checkpoint

    if step is None:
        latest = latest_checkpoint(run_dir)
        if latest is None:
            raise EvalInputError(f"{run_dir} holds no complete Molt checkpoint under {ACTOR_DIR}")
        return latest
    chosen = run_dir / ACTOR_DIR / f"global_step{step}"
    if not chosen.is_dir():
        kept = sorted(p.name for p in (run_dir / ACTOR_DIR).iterdir() if _TAG_STEP.match(p.name))
        raise EvalInputError(f"--step {step}: {run_dir} has no checkpoint {chosen.name} (it keeps "
                             f"{', '.join(kept) or 'none'}); Molt keeps the last --ckpt.max_num checkpoints")
    return chosen


def _from_checkpoint(checkpoint: Path, step: int | None, export_dir: Path) -> ModelSource:
    run_dir = checkpoint.parents[3]  # <run>/ckpt/state/_actor/<tag>
    saved_step = _checkpoint_step(checkpoint)
    if step is not None and step != saved_step:
        raise EvalInputError(f"--step {step}: {checkpoint} holds the weights of step {saved_step}; drop --step")
    from molt_flashreinforce.evaluation.inputs import run_config

    cfg = run_config(run_dir)
    return ModelSource(ModelRef("molt_checkpoint", str(checkpoint), saved_step, str(run_dir)), str(export_dir),
                       base_model_of(cfg), checkpoint)


def base_model_of(cfg: DictConfig) -> str:
    """The model a run trained (its context-extended copy when it used one): its tokenizer is the run's."""
    from molt_flashreinforce.launch.model_context import extended_copy_path

    copy = extended_copy_path(cfg)
    return str(copy) if copy is not None and copy.is_dir() else str(cfg.model.name_or_path)


def resolve_model(spec: str, step: int | None, export_dir: Path) -> ModelSource:
    if step is not None and (isinstance(step, bool) or step < 0):
        raise EvalInputError(f"--step {step}: must be a non-negative integer")
    path = Path(spec).expanduser()
    if path.is_dir():
        if _is_run_dir(path):
            return _from_checkpoint(_run_checkpoint(path, step), None, export_dir)
        if path.name == "model" and _is_checkpoint(path.parent):
            path = path.parent
        if _is_checkpoint(path):
            return _from_checkpoint(path, step, export_dir)
        if (path / "config.json").is_file():
            return _from_hf_dir(path, step)
        raise EvalInputError(f"{spec} is neither a run directory, a Molt checkpoint (<run>/{ACTOR_DIR}/<tag> with "
                             "model/ and extra_state.pt) nor a Hugging Face model directory (config.json)")
    if path.exists() or not _HUB_ID.match(spec):
        raise EvalInputError(f"{spec}: no such checkpoint or model directory (nor a Hugging Face id, org/name)")
    return ModelSource(ModelRef("hf_id", spec, step or 0), spec, spec)


def _from_hf_dir(path: Path, step: int | None) -> ModelSource:
    for parent, name in RUN_EXPORTS:
        tag = name.match(path.name)
        depth = len(parent.parts)
        if not tag or len(path.parents) <= depth or path.parent.relative_to(path.parents[depth]) != parent:
            continue
        run_dir = path.parents[depth]
        if not (run_dir / ".hydra").is_dir():
            continue
        saved_step = int(tag.group(1))
        if step is not None and step != saved_step:
            raise EvalInputError(f"--step {step}: {path} is the export of step {saved_step}; drop --step")
        return ModelSource(ModelRef("hf_dir", str(path), saved_step, str(run_dir)), str(path), str(path))
    return ModelSource(ModelRef("hf_dir", str(path), step or 0), str(path), str(path))


# ── the model's tokenizer and context, before any weights load ──


def _load_tokenizer(source: str):
    from transformers import AutoTokenizer

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return AutoTokenizer.from_pretrained(source)
        except Exception as error:  # noqa: BLE001 - every reason (no files, no network, a bad id) is one refusal
            first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise EvalInputError(f"cannot load the tokenizer of {source} ({first}); pass a model directory or a "
                                 "Hugging Face id whose tokenizer is reachable") from None


def check_tokenizer(source: ModelSource, agent_kind: str | None):
    """The tokenizer, once it is known to render the experiment's prompts as its agent needs."""
    from molt_flashreinforce.agents.chatml import ASSISTANT_PROMPT

    tokenizer = _load_tokenizer(source.tokenizer)
    if not getattr(tokenizer, "chat_template", None):
        raise EvalInputError(f"the tokenizer of {source.tokenizer} has no chat template, and the experiment's prompts "
                             "are chat messages that Molt renders with it (molt.data.apply_chat_template); "
                             "evaluate a model whose tokenizer has one")
    if agent_kind in MULTI_TURN_AGENTS:
        rendered = tokenizer.apply_chat_template([{"role": "user", "content": "?"}], tokenize=False,
                                                 add_generation_prompt=True)
        if not rendered.endswith(ASSISTANT_PROMPT):
            raise EvalInputError(f"the chat template of {source.tokenizer} is not ChatML (a prompt does not end in "
                                 f"{ASSISTANT_PROMPT!r}), and the {agent_kind} agent writes ChatML turns "
                                 "(agents/chatml.py); evaluate a ChatML model (Qwen2.5, Qwen3)")
    return tokenizer


def _config_positions(source: ModelSource) -> int | None:
    from molt_flashreinforce.launch.model_context import _positions, config_max_positions

    if source.checkpoint is not None:
        config = source.checkpoint / "model" / ".hf_metadata" / "config.json"
        return _positions(json.loads(config.read_text(encoding="utf-8"))) if config.is_file() else None
    positions = config_max_positions(source.serve)
    if positions is None:
        from transformers import AutoConfig

        try:
            positions = _positions(AutoConfig.from_pretrained(source.serve).to_dict())
        except Exception:  # noqa: BLE001 - unknown: vLLM itself checks max_model_len
            return None
    return positions


def context_overrides(source: ModelSource, context: int, cfg: DictConfig) -> dict:
    """vLLM ``hf_overrides`` that give the model the context training gave it, or {} when it has it.

    A run with ``model.max_position_embeddings`` trained a copy whose config says so
    (``launch.model_context``); vLLM's ``hf_overrides`` sets the same value without the copy."""
    positions = _config_positions(source)
    if positions is None or context <= positions:
        return {}
    extended = cfg.model.get("max_position_embeddings")
    if extended is None or int(extended) < context:
        raise EvalInputError(f"{source.ref.path}: its context of {positions} positions is below the protocol's "
                             f"{context} tokens (molt.data.max_len); evaluate a model with that context")
    return {"max_position_embeddings": int(extended)}
