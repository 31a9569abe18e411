"""Time the FlashREINFORCE loss against Molt's `PolicyLoss` recipe configuration; measure the
entropy filter's memory.

    python benchmarks/bench_loss.py [--device cpu|cuda] [--dtype float32|bfloat16] [--repeats 7] [--json FILE]

For B=128 and T in {1024, 8192} it times forward+backward of, on the same inputs in this process:
  molt      Molt 0.2.1 PolicyLoss(ppo, IS seq/binary_kl/mask, [-inf, delta], seq-mean-token-mean),
            old = current.detach(): the published way to run FlashREINFORCE on Molt
  ours      molt_flashreinforce.objective.flashreinforce_loss (q = 1)
  ours_q09  the same with the failure-token entropy filter at q = 0.9 (entropies precomputed)
and prints medians and the ratios ours/molt and ours_q09/ours. Then, in fresh subprocesses, the
extra peak memory of `token_entropy` on T=8192, V=152064 logits (the size the filter needs for a
Qwen vocabulary) next to Molt's one-shot `compute_entropy`. On CUDA it also checks bf16 parity.
`--json FILE` also writes every printed number there (the docs quote them from experiments/benchmarks/).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time

import torch

BATCH = 128
LENGTHS = (1024, 8192)
DELTA = 3e-3


def make_inputs(length: int, device: str, dtype: torch.dtype, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(length // 8, length + 1, (BATCH,), generator=generator)
    mask = torch.arange(length).unsqueeze(0) < lengths.unsqueeze(1)
    current = -torch.rand(BATCH, length, generator=generator) * 3
    behavior = current - torch.rand(BATCH, length, generator=generator) * 0.01
    behavior[:4] -= 1.0  # a few rejected trajectories, as in real batches
    rewards = torch.randint(0, 2, (BATCH,), generator=generator).float()
    entropies = torch.rand(BATCH, length, generator=generator) * 4
    move = lambda t: t.to(device)  # noqa: E731
    return (move(current).to(dtype), move(behavior).to(dtype), move(rewards), move(mask), move(entropies))


def timed(fn, device: str) -> float:
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def run_timings(device: str, dtype: torch.dtype, repeats: int) -> None:
    from molt.models.loss import PolicyLoss

    from molt_flashreinforce.objective import FlashReinforceConfig, flashreinforce_loss

    molt_loss = PolicyLoss(is_correction_level="seq", is_correction_gating="binary_kl", is_correction_mode="mask",
                           is_correction_threshold=[float("-inf"), DELTA], loss_agg_mode="seq-mean-token-mean")
    plain, filtered = FlashReinforceConfig(delta=DELTA), FlashReinforceConfig(delta=DELTA, entropy_filter_q=0.9)
    results = {}
    print(f"device={device} dtype={dtype} B={BATCH} median of {repeats} (forward + backward)")
    print(f"{'T':>6} {'molt ms':>9} {'ours ms':>9} {'q=0.9 ms':>9} {'ours/molt':>10} {'q0.9/ours':>10}")
    for length in LENGTHS:
        current, behavior, rewards, mask, entropies = make_inputs(length, device, dtype)
        failures = rewards == 0
        advantages = (rewards - rewards.mean()).unsqueeze(-1) * mask

        def molt_step():
            log_probs = current.detach().requires_grad_()
            loss = molt_loss(log_probs, log_probs.detach(), advantages, action_mask=mask,
                             rollout_log_probs=behavior)[0]
            loss.backward()

        def ours_step(config=plain):
            log_probs = current.detach().requires_grad_()
            flashreinforce_loss(log_probs, behavior, rewards, mask, config, failures=failures,
                                entropies=entropies).loss.backward()

        steps = {"molt": molt_step, "ours": ours_step, "ours_q09": lambda: ours_step(filtered)}
        for step in steps.values():  # warm-up
            step()
        samples = {name: [] for name in steps}
        for _ in range(repeats):  # interleaved so drift in machine load hits every variant alike
            for name, step in steps.items():
                samples[name].append(timed(step, device))
        median = {name: statistics.median(values) * 1e3 for name, values in samples.items()}
        print(f"{length:>6} {median['molt']:>9.2f} {median['ours']:>9.2f} {median['ours_q09']:>9.2f} "
              f"{median['ours'] / median['molt']:>10.3f} {median['ours_q09'] / median['ours']:>10.3f}")
        results[f"T{length}"] = {"molt_ms": median["molt"], "ours_ms": median["ours"], "ours_q09_ms": median["ours_q09"],
                                 "ours_over_molt": median["ours"] / median["molt"],
                                 "q09_over_ours": median["ours_q09"] / median["ours"]}
    return results


_MEMORY_PROBE = """
import resource, sys, torch
which, length, vocab = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
logits = torch.randn(length, vocab, dtype=torch.bfloat16)
logits.add_(0)  # touch every page before the baseline is read
baseline = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
if which == "ours":
    from molt_flashreinforce.entropy import token_entropy
    token_entropy(logits)
else:
    from molt.models.utils import compute_entropy
    with torch.no_grad():
        compute_entropy(logits.float())
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - baseline) / 1024)
"""


def extra_peak_mib(which: str, length: int, vocab: int) -> float:
    result = subprocess.run([sys.executable, "-c", _MEMORY_PROBE, which, str(length), str(vocab)],
                            capture_output=True, text=True, check=True)
    return float(result.stdout.strip().splitlines()[-1])


def run_memory() -> dict[str, float]:
    vocab = 152064
    print(f"\nextra peak RSS of full-vocabulary token entropies, V={vocab}, bf16 logits (fresh process each)")
    # Molt's one-shot version needs several [T, V] float32 buffers; shown at T=1024 to fit this machine.
    results = {"vocab": vocab}
    for which, name, length in (("ours", "token_entropy", 8192), ("molt", "compute_entropy", 1024),
                                ("ours", "token_entropy", 1024)):
        results[f"{which}_T{length}_mib"] = extra_peak_mib(which, length, vocab)
        print(f"  {which:<5} {name:<17} T={length}: {results[f'{which}_T{length}_mib']:8.0f} MiB")
    return results


def run_cuda_parity() -> None:
    from molt.models.loss import PolicyLoss

    from molt_flashreinforce.objective import FlashReinforceConfig, flashreinforce_loss

    current, behavior, rewards, mask, _ = make_inputs(1024, "cuda", torch.bfloat16)
    molt_grad = current.detach().requires_grad_()
    advantages = (rewards - rewards.mean()).unsqueeze(-1) * mask
    PolicyLoss(is_correction_level="seq", is_correction_gating="binary_kl", is_correction_threshold=[float("-inf"), DELTA],
               loss_agg_mode="seq-mean-token-mean")(molt_grad, molt_grad.detach(), advantages, action_mask=mask,
                                                    rollout_log_probs=behavior)[0].backward()
    our_grad = current.detach().requires_grad_()
    flashreinforce_loss(our_grad, behavior, rewards, mask, FlashReinforceConfig(delta=DELTA)).loss.backward()
    difference = (our_grad.grad.float() - molt_grad.grad.float()).abs().max().item()
    print(f"\nCUDA bf16 parity: max |grad ours - grad molt| = {difference:.3e} "
          f"(max |grad| {molt_grad.grad.float().abs().max().item():.3e})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument("--json", metavar="FILE", help="also write the numbers to FILE")
    options = parser.parse_args()
    results = {"measured": datetime.date.today().isoformat(), "device": options.device, "dtype": options.dtype,
               "torch_threads": torch.get_num_threads(), "cpus": os.cpu_count(), "repeats": options.repeats,
               "batch": BATCH, "timings": run_timings(options.device, getattr(torch, options.dtype), options.repeats)}
    if options.device == "cuda":
        run_cuda_parity()
    if not options.skip_memory:
        results["entropy_extra_peak"] = run_memory()
    if options.json:
        with open(options.json, "w", encoding="utf-8") as handle:
            json.dump(results, handle, indent=1)
            handle.write("\n")


if __name__ == "__main__":
    main()
