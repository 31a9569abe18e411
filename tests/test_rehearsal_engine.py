"""The rehearsal's CPU rollout engine (molt_flashreinforce.rehearsal.engine), without Ray.

Its log-probs must be those of the distribution each token was drawn from, equal to a full
forward of the same weights (what Molt's actor computes); it must refuse what vLLM refuses;
pause between tokens; and take a packed weight broadcast over gloo the way Molt's refit sends it.
Molt's own `RouterGenerateClient` parses its HTTP answers.
"""

from __future__ import annotations

import asyncio
import math
import socket
import threading
from types import SimpleNamespace

import pytest
import torch

from molt_flashreinforce.rehearsal.engine import (
    DECODE_DELAY_VARIABLE,
    CpuRolloutEngine,
    EngineConfigError,
    Sampling,
    SamplingError,
    decode_delay_s,
    processed_log_probs,
)
from molt_flashreinforce.rehearsal.tiny_model import build_tiny_model
from molt_flashreinforce.rehearsal.weight_sync import GlooBroadcastGroup

CONTEXT = 4096  # Qwen2.5-Math-1.5B's max_position_embeddings, from its shape card


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_model("Qwen/Qwen2.5-Math-1.5B", tmp_path_factory.mktemp("tiny") / "model", seed=3)


@pytest.fixture(scope="module")
def engine(model_dir):
    return CpuRolloutEngine(model=str(model_dir), max_model_len=CONTEXT, seed=0, dtype="float32")


def full_forward_log_probs(engine, prompt, tokens, temperature):
    with torch.no_grad():
        logits = engine.model(input_ids=torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1 : -1]
    log_probs = torch.log_softmax(logits.float() / temperature, dim=-1)
    return log_probs.gather(1, torch.tensor(tokens)[:, None]).squeeze(1)


def test_log_probs_equal_a_full_forward_of_the_same_weights(engine):
    prompt = [151644, 40, 41, 42, 151645, 198]
    out = asyncio.run(engine.generate(prompt, Sampling(max_tokens=12, temperature=0.7)))
    choice = out["choices"][0]
    tokens = choice["token_ids"]
    returned = torch.tensor([entry["logprob"] for entry in choice["logprobs"]["content"]])
    assert len(tokens) == len(returned) > 0
    torch.testing.assert_close(returned, full_forward_log_probs(engine, prompt, tokens, 0.7), rtol=1e-4, atol=1e-4)
    assert choice["finish_reason"] in {"stop", "length"}


def test_truncated_log_probs_are_renormalised_over_the_kept_tokens():
    logits = torch.tensor([3.0, 2.0, 1.0, 0.5, -1.0])
    top_k = processed_log_probs(logits, Sampling(max_tokens=1, top_k=2))
    assert torch.isinf(top_k[2:]).all() and math.isclose(top_k[:2].exp().sum().item(), 1.0, rel_tol=1e-6)
    probabilities = torch.softmax(logits, dim=-1)  # 0.609, 0.224, 0.082, ...: top_p 0.8 keeps the first two
    top_p = processed_log_probs(logits, Sampling(max_tokens=1, top_p=0.8))
    assert torch.isfinite(top_p[:2]).all() and torch.isinf(top_p[2:]).all()
    torch.testing.assert_close(top_p[:2].exp(), probabilities[:2] / probabilities[:2].sum())
    tempered = processed_log_probs(logits, Sampling(max_tokens=1, temperature=2.0))
    torch.testing.assert_close(tempered, torch.log_softmax(logits / 2.0, dim=-1))


@pytest.mark.parametrize(
    "params, message",
    [
        ({"max_tokens": 0}, "max_tokens must be at least 1"),
        ({"max_tokens": 4, "temperature": -0.5}, "temperature must be non-negative"),
        ({"max_tokens": 4, "top_p": 0.0}, "top_p must be in (0, 1]"),
        ({"max_tokens": 4, "top_k": -2}, "top_k must be -1"),
        ({"max_tokens": 4, "min_tokens": 5}, "min_tokens must be in"),
        ({"max_tokens": 4, "logprobs": 21}, "greater than max allowed: 20"),
        ({"max_tokens": 4, "repetition_penalty": 1.1}, "repetition_penalty=1.1 is not implemented"),
        ({"max_tokens": 4, "stop": ["\n"]}, "stop strings"),
        ({"max_tokens": 4, "beam_width": 2}, "unknown sampling parameter"),
    ],
)
def test_sampling_parameters_vllm_rejects_are_refused(params, message):
    with pytest.raises(SamplingError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        Sampling.from_request(params)


def test_requests_beyond_the_context_or_the_vocabulary_are_refused(engine):
    with pytest.raises(SamplingError, match="maximum context length is 4096"):
        asyncio.run(engine.generate([1] * 4090, Sampling(max_tokens=10)))
    with pytest.raises(SamplingError, match="out of vocabulary"):
        asyncio.run(engine.generate([151936], Sampling(max_tokens=1)))


def test_max_model_len_beyond_the_models_context_is_refused_as_vllm_does(model_dir, monkeypatch):
    monkeypatch.delenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN", raising=False)
    with pytest.raises(EngineConfigError, match=r"max_model_len \(6144\) is greater than .*max_position_embeddings=4096"):
        CpuRolloutEngine(model=str(model_dir), max_model_len=6144)
    assert CpuRolloutEngine(model=str(model_dir), max_model_len=6144, hf_overrides={"max_position_embeddings": 6144}).max_model_len == 6144
    monkeypatch.setenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "1")
    assert CpuRolloutEngine(model=str(model_dir), max_model_len=6144).max_model_len == 6144


def test_pause_holds_a_request_between_tokens_and_resume_continues_it(engine):
    forwards = []
    hook = engine.model.register_forward_hook(lambda *_: forwards.append(1))

    async def scenario():
        task = asyncio.create_task(engine.generate([151644, 40], Sampling(max_tokens=30, ignore_eos=True)))
        for _ in range(5):
            await asyncio.sleep(0)
        await engine.pause_generation()
        held = len(forwards)
        for _ in range(20):
            await asyncio.sleep(0)
        assert len(forwards) <= held + 1 and not task.done()  # at most the forward already under way
        await engine.resume_generation()
        return await task

    try:
        out = asyncio.run(scenario())
    finally:
        hook.remove()
    assert len(out["choices"][0]["token_ids"]) == 30


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_packed_weight_broadcast_lands_on_every_weight(engine, model_dir, monkeypatch):
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")
    port = _free_port()
    trained = {name: torch.randn_like(p) for name, p in engine.model.named_parameters()}
    names = sorted(trained)
    metas = [(name, trained[name].dtype, tuple(trained[name].shape)) for name in names]

    def trainer_rank0():  # what PolicyModelActor.broadcast_to_vllm sends: one packed uint8 buffer
        group = GlooBroadcastGroup("127.0.0.1", port, 0, 2)
        group.broadcast(torch.cat([trained[n].contiguous().view(torch.uint8).view(-1) for n in names]), src=0)

    async def engine_side():
        await engine.init_process_group("127.0.0.1", port, 1, 2, "molt", "nccl")
        await engine.pause_generation()
        await engine.begin_weight_update()
        await engine.reset_weight_update_check()
        await engine.update_weights_packed(metas)
        await engine.end_weight_update()
        missing = await engine.weight_update_missing()
        await engine.resume_generation()
        return missing

    sender = threading.Thread(target=trainer_rank0)
    sender.start()
    missing = asyncio.run(engine_side())
    sender.join()
    assert missing == []
    for name, param in engine.model.named_parameters():
        torch.testing.assert_close(param, trained[name], rtol=0, atol=0)


def test_molts_own_client_parses_the_http_route(engine):
    import aiohttp
    from molt.trainer.rollout.router import RouterGenerateClient

    async def scenario():
        url = await engine.serve_openai()
        async with aiohttp.ClientSession(base_url=url) as http:
            async with http.get("/health") as health:
                assert health.status == 200
            client = RouterGenerateClient(http)
            sampling = SimpleNamespace(max_tokens=6, temperature=1.0, top_p=1.0, top_k=-1, logprobs=1, skip_special_tokens=False)
            output, off_policy = await client.generate([151644, 40, 41], sampling)
            bad = SimpleNamespace(max_tokens=6, temperature=1.0, top_p=0.0, top_k=-1, logprobs=1)
            with pytest.raises(aiohttp.ClientResponseError) as refused:
                await client.generate([151644, 40, 41], bad)
        await engine._server.cleanup()
        return output, off_policy, refused.value.status

    output, off_policy, status = asyncio.run(scenario())
    generation = output.outputs[0]
    assert 1 <= len(generation.token_ids) <= 6 and len(generation.logprobs) == len(generation.token_ids)
    assert all(next(iter(entry.values())).logprob <= 0 for entry in generation.logprobs)
    assert off_policy == 0 and status == 400


def test_per_expert_weights_fill_the_fused_moe_tensors(tmp_path, monkeypatch):
    """Molt's refit sends MoE experts per expert (HF checkpoint names); transformers' Qwen3-MoE
    holds them fused, so the engine stacks them as vLLM's loader does."""
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")
    model = build_tiny_model("Qwen/Qwen3-30B-A3B", tmp_path / "moe")
    moe = CpuRolloutEngine(model=str(model), max_model_len=128, dtype="float32")
    experts = moe.model.model.layers[0].mlp.experts
    n, inter = experts.gate_up_proj.shape[0], experts.gate_up_proj.shape[1] // 2
    sent = {}
    for name, param in moe.model.named_parameters():
        if ".mlp.experts." not in name:
            sent[name] = torch.randn_like(param)
            continue
        prefix = name.rsplit(".", 1)[0]
        for e in range(n):
            if name.endswith("gate_up_proj"):
                sent[f"{prefix}.{e}.gate_proj.weight"] = torch.randn(inter, param.shape[2])
                sent[f"{prefix}.{e}.up_proj.weight"] = torch.randn(inter, param.shape[2])
            else:
                sent[f"{prefix}.{e}.down_proj.weight"] = torch.randn(param.shape[1], param.shape[2])
    names = sorted(sent)
    port = _free_port()

    def trainer_rank0():
        GlooBroadcastGroup("127.0.0.1", port, 0, 2).broadcast(torch.cat([sent[k].view(torch.uint8).view(-1) for k in names]), src=0)

    async def engine_side():
        await moe.init_process_group("127.0.0.1", port, 1, 2, "molt", "nccl")
        await moe.pause_generation()
        await moe.reset_weight_update_check()
        await moe.update_weights_packed([(k, sent[k].dtype, tuple(sent[k].shape)) for k in names])
        return await moe.weight_update_missing()

    sender = threading.Thread(target=trainer_rank0)
    sender.start()
    missing = asyncio.run(engine_side())
    sender.join()
    assert missing == []
    torch.testing.assert_close(experts.gate_up_proj[3], torch.cat([sent["model.layers.0.mlp.experts.3.gate_proj.weight"],
                                                                  sent["model.layers.0.mlp.experts.3.up_proj.weight"]]))
    torch.testing.assert_close(experts.down_proj[5], sent["model.layers.0.mlp.experts.5.down_proj.weight"])


def test_min_tokens_masks_eos_in_the_returned_log_probs(engine):
    """vLLM keeps EOS out of the distribution until min_tokens: the returned log-probs must describe
    that masked distribution, and no EOS may appear before it."""
    prompt = [151644, 40, 41]
    out = asyncio.run(engine.generate(prompt, Sampling(max_tokens=6, min_tokens=6, temperature=1.0, seed=1)))
    choice = out["choices"][0]
    tokens = choice["token_ids"]
    assert len(tokens) == 6 and not set(tokens) & engine.eos_ids
    with torch.no_grad():
        logits = engine.model(input_ids=torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1 : -1].float()
    logits[:, sorted(engine.eos_ids)] = -math.inf
    expected = torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(tokens)[:, None]).squeeze(1)
    returned = torch.tensor([entry["logprob"] for entry in choice["logprobs"]["content"]])
    torch.testing.assert_close(returned, expected, rtol=1e-4, atol=1e-4)


def test_decode_delay_is_read_from_the_environment_and_refused_when_meaningless():
    assert decode_delay_s({}) == 0.0
    assert decode_delay_s({DECODE_DELAY_VARIABLE: "0.25"}) == 0.25
    for bad in ("-1", "abc", "inf", "nan"):
        with pytest.raises(EngineConfigError, match=f"{DECODE_DELAY_VARIABLE}={bad} must be a number of seconds >= 0"):
            decode_delay_s({DECODE_DELAY_VARIABLE: bad})
