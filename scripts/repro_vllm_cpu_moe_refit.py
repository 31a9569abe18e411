"""Reproduce vLLM's CPU MoE refit drift: a refit with the very same weights changes the log-probs.

    python scripts/repro_vllm_cpu_moe_refit.py [--dtype float32|bfloat16] [--with-fix] [--json PATH]

It builds a tiny Qwen3-30B-A3B-shaped model (8 experts, head size 32), starts vLLM's CPU engine
in this process, takes the prompt log-probs of a few fixed token prompts, then reloads the same
checkpoint the way Molt's refit does (`WorkerWrap.begin_weight_update`, `model.load_weights` with
the per-expert Hugging Face names in two flushes, `WorkerWrap.end_weight_update`) and takes them
again. For each MoE layer it also says which layout `w13_weight`/`w2_weight` hold: vLLM's CPU
prepacked layout of the checkpoint's weights (what the kernel reads) or the checkpoint's plain
layout. Exit status 1 when the refit changed the log-probs by more than --tolerance.

With --with-fix it goes on: it applies `repack_cpu_moe_on_refit` (molt_flashreinforce/rehearsal/
vllm_cpu_fixes.py), refits twice more and exits by the last refit instead. --json writes the
measurements. One engine start; about a minute on two cores (more with a cold compile cache).
See docs/vllm-cpu-moe-refit.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

MODEL_CARD = "Qwen/Qwen3-30B-A3B"
PROMPTS = 4
PROMPT_TOKENS = 32


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--with-fix", action="store_true", help="then refit with repack_cpu_moe_on_refit applied")
    parser.add_argument("--tolerance", type=float, default=1e-4, help="max |Δ log-prob| a same-weights refit may cause")
    parser.add_argument("--json", type=Path, help="write the measurements here")
    return parser.parse_args()


def engine_settings(run_dir: Path) -> None:
    """The CPU engine's settings, in this process; caches go to the run's directory unless set."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # engine and worker in this process
    os.environ["VLLM_CPU_KVCACHE_SPACE"] = "1"
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"
    for name in ("TORCHINDUCTOR_CACHE_DIR", "VLLM_CACHE_ROOT"):
        os.environ.setdefault(name, str(run_dir / name.lower()))


def prompt_logprobs(llm, prompts: list[list[int]]) -> torch.Tensor:
    """Each prompt token's log-prob given the tokens before it (the first token has none)."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0)
    outputs = llm.generate([TokensPrompt(prompt_token_ids=ids) for ids in prompts], params, use_tqdm=False)
    return torch.tensor(
        [entry[token].logprob for out, ids in zip(outputs, prompts) for entry, token in zip(out.prompt_logprobs[1:], ids[1:])],
        dtype=torch.float64,
    )


def refit(worker, weights: list[tuple[str, torch.Tensor]]) -> None:
    """Molt's refit of all weights, without the broadcast (`trainer/vllm/vllm_worker_wrap.py`)."""
    from molt.trainer.vllm.vllm_worker_wrap import WorkerWrap
    from vllm.config import set_current_vllm_config

    WorkerWrap.begin_weight_update(worker)
    half = len(weights) // 2
    with set_current_vllm_config(worker.vllm_config):
        for flush in (weights[:half], weights[half:]):
            worker.model_runner.model.load_weights(weights=flush)
    WorkerWrap.end_weight_update(worker)


def expert_layouts(worker, checkpoint: dict[str, torch.Tensor]) -> dict[str, dict[str, float]]:
    """Per MoE layer: max |Δ| of w13/w2 from the checkpoint's weights prepacked for the CPU kernel
    ("vs_packed") and from the same weights in plain layout ("vs_plain")."""
    from vllm._custom_ops import cpu_prepack_moe_weight

    layouts = {}
    for name, layer in worker.model_runner.model.named_modules():
        if not hasattr(layer, "w13_weight"):
            continue
        experts = layer.quant_method.moe_kernel.fused_experts
        block = name.partition(".experts")[0]  # model.layers.N.mlp, as in the checkpoint's names
        count = layer.w13_weight.shape[0]

        def stacked(*projections):
            return torch.stack(
                [torch.cat([checkpoint[f"{block}.experts.{e}.{p}.weight"] for p in projections]) for e in range(count)]
            ).to(layer.w13_weight.dtype)

        plain = {"w13_weight": stacked("gate_proj", "up_proj"), "w2_weight": stacked("down_proj")}
        for param, weight in plain.items():
            held = getattr(layer, param).detach()
            layouts[f"{name}.{param}"] = {
                "vs_packed": (held - cpu_prepack_moe_weight(weight, experts.isa)).abs().max().item(),
                "vs_plain": (held - weight).abs().max().item(),
            }
    return layouts


def main() -> int:
    args = parse_args()
    with tempfile.TemporaryDirectory(prefix="moe-refit-") as tmp:
        run_dir = Path(tmp)
        engine_settings(run_dir)
        from safetensors.torch import load_file

        from molt_flashreinforce.rehearsal.tiny_model import build_tiny_model

        model_dir = build_tiny_model(MODEL_CARD, run_dir / "model", seed=0)
        checkpoint = load_file(str(model_dir / "model.safetensors"))
        weights = sorted(checkpoint.items())

        from vllm import LLM

        started = time.monotonic()
        llm = LLM(
            model=str(model_dir), dtype=args.dtype, enforce_eager=True, max_model_len=64, max_num_seqs=PROMPTS,
            enable_prefix_caching=False, distributed_executor_backend="uni", seed=0,
        )
        print(f"engine up in {time.monotonic() - started:.0f} s ({args.dtype})", flush=True)
        generator = torch.Generator().manual_seed(0)
        prompts = torch.randint(256, 151643, (PROMPTS, PROMPT_TOKENS), generator=generator).tolist()

        def measure(label: str, baseline: torch.Tensor | None) -> tuple[torch.Tensor, dict]:
            logprobs = prompt_logprobs(llm, prompts)
            layouts = llm.collective_rpc(expert_layouts, args=(checkpoint,))[0]
            row = {"label": label, "layouts": layouts}
            if baseline is not None:
                drift = (logprobs - baseline).abs()
                row |= {"max_abs_delta": drift.max().item(), "mean_abs_delta": drift.mean().item()}
            packed = sum(v["vs_packed"] == 0 for v in layouts.values())
            plain = sum(v["vs_plain"] == 0 for v in layouts.values())
            delta = "" if baseline is None else f"; log-probs vs start: max |Δ| {row['max_abs_delta']:.3g}, mean {row['mean_abs_delta']:.3g}"
            print(f"{label}: of {len(layouts)} expert tensors {packed} hold the packed layout, {plain} the plain one{delta}", flush=True)
            return logprobs, row

        start, row = measure("start", None)
        rows = [row]
        llm.collective_rpc(refit, args=(weights,))
        rows.append(measure("refit, same weights", start)[1])
        if args.with_fix:
            from molt_flashreinforce.rehearsal.vllm_cpu_fixes import repack_cpu_moe_on_refit

            covered = llm.collective_rpc(lambda worker: repack_cpu_moe_on_refit(worker.model_runner.model))[0]
            print(f"repack_cpu_moe_on_refit covers {covered} MoE layers", flush=True)
            for label in ("refit with the fix", "second refit with the fix"):
                llm.collective_rpc(refit, args=(weights,))
                rows.append(measure(label, start)[1])
        if args.json:
            args.json.write_text(json.dumps({"dtype": args.dtype, "moe_layers_fixed": covered if args.with_fix else 0, "runs": rows}, indent=1))
        drift = rows[-1]["max_abs_delta"]
        verdict = "drift present" if drift > args.tolerance else "no drift"
        print(f"{verdict}: max |Δ log-prob| {drift:.3g} after '{rows[-1]['label']}' (tolerance {args.tolerance:g})")
        return 1 if drift > args.tolerance else 0


if __name__ == "__main__":
    sys.exit(main())
