"""A tiny model with a paper model's shape, built locally with random weights.

    build_tiny_model(name_or_path, out_dir, seed) -> Path

From the model's shape card (`molt_flashreinforce.modelcards`) it writes a Hugging Face model
directory that Molt, transformers and the rehearsal engine load like the real checkpoint:

* the same architecture class (Qwen2ForCausalLM, Qwen3MoeForCausalLM with expert routing), the
  card's vocabulary size, context length (`max_position_embeddings`), rope theta, tied or untied
  embeddings and BOS/EOS ids; width, depth and expert count shrunk (`TINY_SHAPE`);
* a byte-level BPE tokenizer with Qwen2's pre-tokenization, the family's added tokens at their
  real ids (151643 onwards) and the family's chat template. Its regular vocabulary (ids below
  151643) is the 256 bytes, the words of the agents' prompts (so prompts are about as long in
  tokens as with the real tokenizer), then strings of up to four symbols of the tasks' alphabet
  (digits, whole boxed answers, a whole valid tool call, ALFWorld commands): a policy with random
  weights then writes task-shaped text, so some rollouts earn reward and some call the tool.

Nothing is downloaded. The same (card, seed) always gives the same weights.
"""

from __future__ import annotations

import functools
import itertools
import json
import re
import string
from importlib import resources
from pathlib import Path

import torch
import yaml

from molt_flashreinforce.modelcards import card

FIRST_ADDED_ID = 151643
# Two heads of 32: the smallest head size vLLM's CPU attention runs (its engine serves these models
# in the tests); one key-value head keeps the real models' grouped-query attention.
TINY_SHAPE = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 128}
TINY_MOE = {"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32}
# Symbols a random policy combines into tokens (see the module docstring): whole boxed answers,
# a whole valid Python tool call and whole ALFWorld commands, so that random text earns reward,
# runs the sandbox and plays the game.
TASK_SYMBOLS = [
    *string.digits, " ", "\n", "+", "=", ")", "}", "\\boxed{",
    *(f"\\boxed{{{digit}}}" for digit in string.digits),
    '<tool_call>\n{"name": "python", "arguments": {"code": "print(1 + 1)"}}\n</tool_call>',
    "<action>look</action>", "<action>inventory</action>", "<action>go to countertop 1</action>",
    "<action>go to fridge 1</action>", "<action>open fridge 1</action>",
]
MAX_SYMBOLS_PER_TOKEN = 4
QWEN2_PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)


@functools.lru_cache(maxsize=1)
def _token_families() -> dict:
    text = (resources.files("molt_flashreinforce.modelcards") / "tokens.yaml").read_text(encoding="utf-8")
    return yaml.safe_load(text)


def _byte_symbols() -> list[str]:
    """GPT-2's byte-level alphabet: the printable character standing for each byte value."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    extra = iter(range(256, 512))
    return [chr(b) if b in printable else chr(next(extra)) for b in range(256)]


def _prompt_words() -> list[str]:
    """The words of the agents' fixed prompt texts, so that prompts tokenize about word by word."""
    from molt_flashreinforce.agents.alfworld_protocol import INSTRUCTIONS
    from molt_flashreinforce.agents.python_tool_protocol import SYSTEM_PROMPT
    from molt_flashreinforce.rehearsal.data import PROMPT_TEXTS

    return sorted(set(re.findall(r"[A-Za-z]+", " ".join([INSTRUCTIONS, SYSTEM_PROMPT, *PROMPT_TEXTS]))))


def regular_vocabulary(reserved: frozenset[str], size: int = FIRST_ADDED_ID) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """A byte-level BPE vocabulary of `size` tokens and its merges: the 256 bytes, the prompts'
    words (alone and after a space, as Qwen2 pre-tokenizes them), each task symbol, then strings
    of 2..MAX_SYMBOLS_PER_TOKEN symbols, each merged from two shorter ones. No token equals a
    `reserved` (added) token, and no merge passes through one (text holding an added token
    still encodes it as that token: the added-token split runs before BPE)."""
    byte_symbols = _byte_symbols()
    vocab = {symbol: index for index, symbol in enumerate(byte_symbols)}
    merges: list[tuple[str, str]] = []

    def encoded(text: str) -> str:
        return "".join(byte_symbols[b] for b in text.encode("utf-8"))

    blocked = {encoded(token) for token in reserved}

    def chain(piece: str) -> bool:
        """Add `piece` with every prefix its merges need; a prefix that is an added token is
        skipped by starting the right part just after it. True once the vocabulary is full."""
        split = max((len(token) - 1 for token in blocked if piece.startswith(token)), default=0)
        for part in ([piece] if not split else [piece[:split], piece[split:]]):
            for end in range(2, len(part) + 1):
                if part[:end] not in vocab:
                    vocab[part[:end]] = len(vocab)
                    merges.append((part[: end - 1], part[end - 1]))
        if split and piece not in vocab:
            vocab[piece] = len(vocab)
            merges.append((piece[:split], piece[split:]))
        return len(vocab) >= size

    symbols = [encoded(symbol) for symbol in TASK_SYMBOLS]
    for piece in [encoded(w) for word in _prompt_words() for w in (word, " " + word)] + symbols:
        if chain(piece):
            return vocab, merges
    for length in range(2, MAX_SYMBOLS_PER_TOKEN + 1):
        for combination in itertools.product(symbols, repeat=length):
            piece = "".join(combination)
            if piece in vocab or piece in blocked:
                continue
            splits = ("".join(combination[:j]) for j in range(1, length))
            left = next((part for part in splits if part in vocab and piece[len(part) :] in vocab), None)
            if left is not None:
                vocab[piece] = len(vocab)
                merges.append((left, piece[len(left) :]))
                if len(vocab) == size:
                    return vocab, merges
    raise ValueError(f"the task alphabet yields fewer than {size} tokens")


def _model_config(model_card: dict):
    from transformers import AutoConfig

    shape = dict(model_card["config"])
    model_type = shape.pop("model_type")
    shape.update(TINY_SHAPE)
    heads, kv_heads = model_card["config"]["num_attention_heads"], model_card["config"]["num_key_value_heads"]
    shape["num_key_value_heads"] = max(1, TINY_SHAPE["num_attention_heads"] * kv_heads // heads)
    if "head_dim" in shape:
        shape["head_dim"] = TINY_SHAPE["hidden_size"] // TINY_SHAPE["num_attention_heads"]
    if "num_experts" in shape:
        shape.update(TINY_MOE)
    return AutoConfig.for_model(
        model_type, architectures=[model_card["architecture"]], dtype="bfloat16", use_sliding_window=False, **shape
    )


def _tokenizer(model_card: dict):
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    family = _token_families()["families"][model_card["special_tokens"]]
    added = family["added_tokens"]
    vocab, merges = regular_vocabulary(frozenset(added))
    backend = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    # Qwen2's own pre-tokenization (transformers' Qwen2Tokenizer rebuilds exactly this from the
    # vocabulary and merges when it loads the directory).
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    not_special = set(family.get("not_special", []))
    # Added to the backend first, in order, so that each lands on its real id.
    backend.add_tokens([AddedToken(t, special=t not in not_special, normalized=False) for t in added])
    for offset, token in enumerate(added):
        if backend.token_to_id(token) != FIRST_ADDED_ID + offset:
            raise RuntimeError(f"{token} did not land on id {FIRST_ADDED_ID + offset}")
    template = _token_families()["chat_templates"][model_card["chat_template"]]
    if model_card.get("default_system"):
        template = "{%- set default_system = " + json.dumps(model_card["default_system"]) + " %}" + template
    bos_id = model_card["config"].get("bos_token_id")
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=added[bos_id - FIRST_ADDED_ID] if model_card["chat_template"] == "deepseek_r1" else None,
        eos_token=model_card["eos_token"],
        pad_token=model_card["pad_token"],
        unk_token=model_card["eos_token"],
        chat_template=template,
    )
    return tokenizer


def build_tiny_model(name_or_path: str, out_dir: str | Path, seed: int = 0) -> Path:
    """Write the tiny model of `name_or_path`'s shape card into `out_dir` (created)."""
    from transformers import AutoModelForCausalLM, GenerationConfig

    model_card = card(name_or_path)
    if model_card is None:
        raise ValueError(f"no shape card for model {name_or_path!r}; the cards are in molt_flashreinforce/modelcards/cards.yaml")
    out_dir = Path(out_dir)
    config = _model_config(model_card)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(out_dir)
    _tokenizer(model_card).save_pretrained(out_dir)
    # No sampling defaults: the rollout settings come from the run's flags alone.
    GenerationConfig(bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id).save_pretrained(out_dir)
    (out_dir / "shape_card.json").write_text(json.dumps({"model": name_or_path, "source": model_card["source"]}, indent=1))
    return out_dir
