"""The rehearsal's vLLM worker extension (rehearsal/vllm_worker.py) in vLLM's CPU build, without Ray.

A tiny model with tied embeddings (Qwen2.5-Math-1.5B's card ties them) is served by vLLM's engine
in float32 with `CpuWorkerWrap`; the test is the trainer's side of Molt's refit: a gloo group
(rehearsal/weight_sync.py), the packed uint8 broadcast of every Hugging Face weight, and Molt's
sequence (reset check, begin, packed update, end, missing check). After each refit the engine's
log-probs on a fixed sequence must equal the Hugging Face forward of the weights just sent, in
float32 (within 1e-4). Without the tied lm_head's re-pack (`repack_tied_lm_head`) this test fails
at the first refit (every probe log-prob off, by up to 0.55 nats when measured): vLLM's CPU build
keeps a packed copy of the head that a refit never refreshes.
"""

from __future__ import annotations

import socket
import threading

import pytest
import torch

from molt_flashreinforce.evaluation.engine import vllm_version
from molt_flashreinforce.rehearsal.tiny_model import build_tiny_model
from molt_flashreinforce.rehearsal.vllm_actor import CPU_ENVIRONMENT, WORKER_EXTENSION
from molt_flashreinforce.rehearsal.weight_sync import GlooBroadcastGroup

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(vllm_version() is None, reason="vLLM's CPU build is not installed (scripts/setup_vllm.sh)"),
]
PROBE = [151644, 8, 40, 41, 42, 17, 151645, 198, 16, 23, 9, 30, 31]  # a fixed token sequence


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def hf_log_probs(model, tokens: list[int]) -> torch.Tensor:
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([tokens])).logits[0, :-1].float()
    return torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(tokens[1:])[:, None]).squeeze(1)


def engine_log_probs(llm, tokens: list[int]) -> torch.Tensor:
    """vLLM's log-prob of each token of `tokens` after the ones before it (prompt log-probs)."""
    from vllm import SamplingParams, TokensPrompt

    (out,) = llm.generate(TokensPrompt(prompt_token_ids=tokens), SamplingParams(max_tokens=1, prompt_logprobs=0),
                          use_tqdm=False)
    return torch.tensor([entry[token].logprob for entry, token in zip(out.prompt_logprobs[1:], tokens[1:])])


@pytest.fixture(scope="module")
def served(tmp_path_factory, warm_compile_cache):
    """(vLLM's offline engine on the tied tiny model with CpuWorkerWrap, the trainer's end of the
    weight-sync group, the model directory)."""
    from transformers import AutoConfig

    root = tmp_path_factory.mktemp("vllm_worker")
    model_dir = build_tiny_model("Qwen/Qwen2.5-Math-1.5B", root / "model", seed=0)
    assert AutoConfig.from_pretrained(model_dir).tie_word_embeddings
    with pytest.MonkeyPatch.context() as env:
        for name, value in {**CPU_ENVIRONMENT, "TORCHINDUCTOR_CACHE_DIR": str(warm_compile_cache),
                            "VLLM_CACHE_ROOT": str(root / "cache"), "VLLM_ALLOW_INSECURE_SERIALIZATION": "1",
                            "VLLM_WORKER_MULTIPROC_METHOD": "spawn"}.items():
            env.setenv(name, value)
        from vllm import LLM

        llm = LLM(model=str(model_dir), dtype="float32", enforce_eager=True, max_model_len=256, seed=0,
                  worker_extension_cls=WORKER_EXTENSION)
        port, joined = _free_port(), []
        trainer = threading.Thread(target=lambda: joined.append(GlooBroadcastGroup("127.0.0.1", port, 0, 2)))
        trainer.start()
        llm.collective_rpc("init_process_group", args=("127.0.0.1", port, 1, 2, "refit", "gloo"))
        trainer.join()
        yield llm, joined[0], model_dir
        llm.llm_engine.engine_core.shutdown()


def refit(llm, group: GlooBroadcastGroup, model) -> list:
    """Molt's refit sequence with one packed flush of every weight of `model`; the missing-weight check."""
    params = [(name, param.detach().contiguous()) for name, param in model.named_parameters()]
    metas = [(name, param.dtype, tuple(param.shape)) for name, param in params]
    packed = torch.cat([param.reshape(-1).view(torch.uint8) for _, param in params])
    llm.collective_rpc("reset_weight_update_check")
    llm.collective_rpc("begin_weight_update")
    sender = threading.Thread(target=group.broadcast, args=(packed, 0))
    sender.start()
    llm.collective_rpc("update_weights_packed", args=(metas,))
    sender.join()
    llm.collective_rpc("end_weight_update")
    (missing,) = llm.collective_rpc("weight_update_missing")
    return missing


def test_a_refit_lands_new_weights_on_a_tied_head_and_back(served, tmp_path):
    from transformers import AutoModelForCausalLM

    llm, group, model_dir = served
    first = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    other = AutoModelForCausalLM.from_pretrained(build_tiny_model("Qwen/Qwen2.5-Math-1.5B", tmp_path / "other", seed=7),
                                                 dtype=torch.float32).eval()
    torch.testing.assert_close(engine_log_probs(llm, PROBE), hf_log_probs(first, PROBE), rtol=0, atol=1e-4)
    moved = (hf_log_probs(other, PROBE) - hf_log_probs(first, PROBE)).abs().mean()
    assert moved > 0.1  # the two weight sets tell apart on the probe

    assert refit(llm, group, other) == []  # every engine weight was assigned (the tied head is one with the embedding)
    torch.testing.assert_close(engine_log_probs(llm, PROBE), hf_log_probs(other, PROBE), rtol=0, atol=1e-4)
    # The refit check's reference: the weights this refit sent, through Hugging Face's forward.
    (reference,) = llm.collective_rpc("refit_reference", args=(PROBE,))
    torch.testing.assert_close(torch.tensor(reference), hf_log_probs(other, PROBE), rtol=0, atol=1e-5)
    assert refit(llm, group, first) == []
    torch.testing.assert_close(engine_log_probs(llm, PROBE), hf_log_probs(first, PROBE), rtol=0, atol=1e-4)


def test_the_refit_check_stops_a_refit_that_serves_other_or_stale_weights():
    from molt_flashreinforce.rehearsal.vllm_actor import RefitMismatch, check_refit

    check_refit(1, [-1.0, -2.0], [-1.00002, -2.0], 1e-4, None)  # within float32's precision
    check_refit(2, [-1.0, -2.0], [-1.0, -2.00003], 1e-4, ([-1.0, -2.0], [-1.0, -2.0]))  # a step too small to tell
    with pytest.raises(RefitMismatch, match=r"^refit 3: the engine's log-probs on the probe differ from the weights "
                                            r"sent by up to 0\.3 nats \(tolerance 0\.0001\)"):
        check_refit(3, [-1.0, -2.0], [-1.0, -2.3], 1e-4, None)
    with pytest.raises(RefitMismatch, match=r"^refit 4: the weights sent moved the probe's log-probs by up to 0\.5 "
                                            r"nats and the engine's not at all; the refit landed stale weights$"):
        check_refit(4, [-1.0, -2.0], [-1.5, -2.0], 1e-4, ([-1.0, -2.0], [-1.0, -2.0]))


def test_under_the_supervisor_a_refit_mismatch_ends_the_run_without_a_restart(tmp_path, monkeypatch):
    from molt_flashreinforce.cluster.progress import FAILURE_FILE, PROGRESS_DIR_VARIABLE, read_json
    from molt_flashreinforce.rehearsal.vllm_actor import RefitMismatch, check_refit

    monkeypatch.setenv(PROGRESS_DIR_VARIABLE, str(tmp_path))
    check_refit(1, [-1.0, -2.0], [-1.00002, -2.0], 1e-4, None)
    assert read_json(tmp_path / FAILURE_FILE) is None  # a refit that landed records nothing
    with pytest.raises(RefitMismatch) as raised:
        check_refit(2, [-1.0, -2.0], [-1.0, -2.3], 1e-4, None)
    failure = read_json(tmp_path / FAILURE_FILE)
    assert failure["what"] == "vLLM's engine (RolloutRayActor)" and failure["cause"] == str(raised.value)
    assert failure["every_attempt"] and failure["code_fault"]  # cluster.supervisor: "not restarted"
