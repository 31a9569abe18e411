"""bf16 against float32 arithmetic on this CPU, for the CPU rehearsal's float32 stand-in.

    python benchmarks/bench_cpu_dtype.py --out experiments/benchmarks/cpu_dtype.json

Times what dominates a rehearsal's training step: a tiny model's output layer over a real
vocabulary (hidden 64, Qwen2.5's 152,064 tokens) for `--tokens` positions, forward and backward
(the logits' gradient flowing to the hidden states and to the weight), in bf16 and in float32,
taking turns over `--rounds` rounds in one process so that both see the same machine load. It
prints and writes the median seconds of each and the ratio bf16 / float32, with the CPU's
capability as torch reports it (a CPU with AVX512-BF16 or AMX runs bf16 natively; AVX2 does not).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch

HIDDEN, VOCAB = 64, 152_064


def step_seconds(dtype: torch.dtype, tokens: int) -> float:
    hidden = torch.randn(tokens, HIDDEN, dtype=dtype, requires_grad=True)
    weight = torch.randn(VOCAB, HIDDEN, dtype=dtype, requires_grad=True)
    started = time.perf_counter()
    logits = hidden @ weight.T
    logits.float().logsumexp(-1).sum().backward()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    torch.manual_seed(0)
    step_seconds(torch.float32, 64), step_seconds(torch.bfloat16, 64)  # first-call costs
    times: dict[str, list[float]] = {"bfloat16": [], "float32": []}
    for _ in range(args.rounds):
        for name in times:
            times[name].append(step_seconds(getattr(torch, name), args.tokens))
    median = {name: statistics.median(values) for name, values in times.items()}
    result = {
        "tokens": args.tokens, "hidden": HIDDEN, "vocab": VOCAB, "rounds": args.rounds,
        "median_s": median, "bf16_over_fp32": median["bfloat16"] / median["float32"],
        "cpu_capability": torch.backends.cpu.get_cpu_capability(), "threads": torch.get_num_threads(),
        "machine": platform.machine(), "torch": torch.__version__,
    }
    print(f"output layer, {args.tokens} tokens x {VOCAB} vocabulary, forward+backward ({result['cpu_capability']}, "
          f"{result['threads']} threads): bf16 {median['bfloat16']:.2f} s, float32 {median['float32']:.2f} s, "
          f"bf16/float32 = {result['bf16_over_fp32']:.1f}x")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
