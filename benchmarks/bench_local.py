"""Throughput of the local backend: generation and training tokens per second.

    python benchmarks/bench_local.py                       # the tiny experiment's default config
    python benchmarks/bench_local.py local.device=cuda local.model.n_layer=12 local.model.n_embd=768 \
        local.model.n_head=12 local.rollouts_per_step=1024 local.num_threads=16

Arguments are Hydra overrides applied on top of `experiment=tiny`. After a short supervised warm
start (so responses have realistic lengths) and a few untimed updates, it times `--updates`
updates, split into sampling (`collect`: KV-cache generation with stored log-probs from the lag
snapshot) and learning (`update`: forward, loss through Molt's PolicyLoss, backward, AdamW step).

Generation tokens are sampled policy tokens; training tokens are every token the learner's
forward and backward process (prompt + response, padding included). `--json FILE` also writes the
numbers there (the docs quote them from experiments/benchmarks/).
"""

from __future__ import annotations

import argparse
import datetime
import json
import time

import torch
from hydra import compose, initialize_config_module

from molt_flashreinforce.local.config import LocalConfig
from molt_flashreinforce.local.trainer import LocalTrainer


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--updates", type=int, default=20, help="timed updates")
    parser.add_argument("--untimed", type=int, default=3, help="updates run before timing starts")
    parser.add_argument("--warm-start-steps", type=int, default=100, help="supervised steps before timing")
    parser.add_argument("--json", metavar="FILE", help="also write the numbers to FILE")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. local.device=cuda")
    args = parser.parse_args()

    with initialize_config_module("molt_flashreinforce.conf", version_base="1.3"):
        cfg = compose("config", overrides=["experiment=tiny", f"local.warm_start.steps={args.warm_start_steps}",
                                           *args.overrides])
    local = LocalConfig.from_node(cfg.local)
    torch.set_num_threads(local.num_threads)
    trainer = LocalTrainer(local, cfg.algo, int(cfg.seed))
    trainer.warm_start()
    for _ in range(args.untimed):
        trainer.step()

    generated = trained = 0
    sampling_s = learning_s = 0.0
    for _ in range(args.updates):
        _sync(trainer.device)
        t0 = time.perf_counter()
        rollouts, answers = trainer.collect()
        _sync(trainer.device)
        t1 = time.perf_counter()
        trainer.update(rollouts, answers)
        _sync(trainer.device)
        t2 = time.perf_counter()
        sampling_s += t1 - t0
        learning_s += t2 - t1
        generated += int(rollouts.mask.sum())
        trained += rollouts.prompt_ids.numel() + rollouts.response_ids.numel()

    params = sum(p.numel() for p in trainer.policy.parameters())
    device = torch.cuda.get_device_name(trainer.device) if trainer.device.type == "cuda" else \
        f"cpu, {local.num_threads} thread(s)"
    print(f"config: {cfg.algo.name}, {local.model.n_layer} layers x {local.model.n_embd} wide ({params / 1e6:.2f} M "
          f"params), B={local.rollouts_per_step}, policy_lag={local.policy_lag}, device {device}")
    print(f"generation tokens/s: {generated / sampling_s:,.0f}  ({generated} tokens in {sampling_s:.2f} s)")
    print(f"training tokens/s:   {trained / learning_s:,.0f}  ({trained} tokens in {learning_s:.2f} s)")
    print(f"updates/s: {args.updates / (sampling_s + learning_s):.2f}  "
          f"(sampling {sampling_s / (sampling_s + learning_s):.0%} of update time)")
    if args.json:
        results = {"measured": datetime.date.today().isoformat(), "device": device, "overrides": args.overrides,
                   "generation_tokens_per_s": generated / sampling_s, "training_tokens_per_s": trained / learning_s,
                   "updates_per_s": args.updates / (sampling_s + learning_s),
                   "sampling_fraction": sampling_s / (sampling_s + learning_s)}
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(results, handle, indent=1)
            handle.write("\n")


if __name__ == "__main__":
    main()
