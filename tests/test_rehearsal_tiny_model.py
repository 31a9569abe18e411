"""Tiny models with each paper model's shape (molt_flashreinforce.rehearsal.tiny_model), built
from the shipped shape cards: architecture class, vocabulary, context, rope, tied embeddings,
special-token ids and chat template are the real model's; width and depth are not."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from molt_flashreinforce.modelcards import card, cards, max_positions
from molt_flashreinforce.rehearsal.tiny_model import FIRST_ADDED_ID, TINY_SHAPE, build_tiny_model

EXPERIMENT_MODELS = ["Qwen/Qwen2.5-Math-1.5B", "Qwen/Qwen2.5-7B-Instruct", "Qwen/Qwen3-30B-A3B",
                     "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B"]


def test_every_experiment_model_has_a_card_with_its_source():
    from omegaconf import OmegaConf
    from importlib import resources

    folder = resources.files("molt_flashreinforce.conf") / "experiment"
    models = {OmegaConf.create(p.read_text()).model.name_or_path for p in folder.iterdir() if p.name.endswith(".yaml") and p.name != "tiny.yaml"}
    assert models == set(EXPERIMENT_MODELS) <= set(cards())
    for name in models:
        assert card(name)["source"].startswith(f"https://huggingface.co/{name}/")
    assert max_positions("Qwen/Qwen2.5-Math-1.5B") == 4096 and max_positions("/models/Qwen/Qwen2.5-Math-1.5B") == 4096
    assert card("some/unknown-model") is None


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("cards")
    return {name: build_tiny_model(name, root / name.replace("/", "--")) for name in EXPERIMENT_MODELS}


@pytest.mark.parametrize("name", EXPERIMENT_MODELS)
def test_tiny_model_keeps_the_cards_shape_and_shrinks_width_and_depth(built, name):
    shape = card(name)["config"]
    config = AutoConfig.from_pretrained(built[name])
    assert config.architectures == [card(name)["architecture"]] and config.model_type == shape["model_type"]
    for key in ("vocab_size", "max_position_embeddings", "rope_theta", "tie_word_embeddings", "bos_token_id", "eos_token_id"):
        assert getattr(config, key, None) == shape[key] or (key == "rope_theta" and config.rope_parameters["rope_theta"] == shape[key])
    assert config.hidden_size == TINY_SHAPE["hidden_size"] < shape["hidden_size"]
    assert config.num_hidden_layers == TINY_SHAPE["num_hidden_layers"] < shape["num_hidden_layers"]
    model = AutoModelForCausalLM.from_pretrained(built[name])
    assert type(model).__name__ == card(name)["architecture"]
    assert model.get_output_embeddings().weight.shape[0] == shape["vocab_size"]
    if "num_experts" in shape:  # expert routing survives the shrink
        gates = [m for n, m in model.named_modules() if n.endswith("mlp.gate")]
        assert gates and config.num_experts > config.num_experts_per_tok > 1
        with torch.no_grad():
            model(input_ids=torch.tensor([[1, 2, 3]]))


@pytest.mark.parametrize("name", EXPERIMENT_MODELS)
def test_vllms_cpu_engine_runs_the_tiny_models_attention(built, name):
    cpu_attention = pytest.importorskip("vllm.v1.attention.backends.cpu_attn", reason="vLLM's CPU build is not installed")
    config = AutoConfig.from_pretrained(built[name])
    head_size = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    assert head_size in cpu_attention.CPUAttentionBackend.get_supported_head_sizes()
    assert config.num_attention_heads > config.num_key_value_heads  # grouped-query attention, as the real models


@pytest.mark.parametrize("name", EXPERIMENT_MODELS)
def test_tokenizer_has_the_real_special_token_ids_and_chat_template(built, name):
    tokenizer = AutoTokenizer.from_pretrained(built[name])
    assert tokenizer.convert_tokens_to_ids(card(name)["eos_token"]) == card(name)["config"]["eos_token_id"]
    messages = [{"role": "user", "content": "What is $2+3$? Put it in \\boxed{}."}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids, skip_special_tokens=False) == text  # byte-level: lossless
    if card(name)["chat_template"] == "deepseek_r1":
        assert ids[:2] == [151646, 151644] and ids[-3:-1] == [151645, 151648]  # BOS, User ... Assistant, <think>
        assert text.endswith("<｜Assistant｜><think>\n")
    else:
        assert ids[0] == 151644 and text.endswith("<|im_start|>assistant\n")  # <|im_start|>
        system = card(name)["default_system"]
        assert text.startswith(f"<|im_start|>system\n{system}<|im_end|>") if system else "system" not in text
    if name == "Qwen/Qwen3-30B-A3B":
        off = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, enable_thinking=False)
        assert off.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert max(ids) < FIRST_ADDED_ID + 30 and len(tokenizer) <= card(name)["config"]["vocab_size"]


def test_building_is_deterministic(tmp_path):
    a = build_tiny_model("Qwen/Qwen2.5-Math-1.5B", tmp_path / "a", seed=1)
    b = build_tiny_model("Qwen/Qwen2.5-Math-1.5B", tmp_path / "b", seed=1)
    assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()
    assert json.loads((a / "tokenizer.json").read_text()) == json.loads((b / "tokenizer.json").read_text())
