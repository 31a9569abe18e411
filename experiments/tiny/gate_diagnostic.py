"""Which trajectories does the trust region admit at policy lag 8? Successes or failures?

    python experiments/tiny/gate_diagnostic.py [--updates 100] [hydra overrides...]

Runs the tiny experiment (default: FlashREINFORCE, delta 3e-3, lag 8, seed 0) and, for every
update, records the gate's decision per trajectory (Molt's PolicyLoss path, as in training)
split by reward. It prints acceptance among successful and failed trajectories and their mean
sequence KL, in blocks of 25 updates.
"""

from __future__ import annotations

import argparse

import torch
from hydra import compose, initialize_config_module

from molt_flashreinforce.local.config import LocalConfig
from molt_flashreinforce.local.trainer import LocalTrainer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--updates", type=int, default=100)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    with initialize_config_module("molt_flashreinforce.conf", version_base="1.3"):
        cfg = compose("config", overrides=["experiment=tiny", "local.policy_lag=8", *args.overrides])
    local = LocalConfig.from_node(cfg.local)
    torch.set_num_threads(local.num_threads)
    trainer = LocalTrainer(local, cfg.algo, int(cfg.seed))
    trainer.warm_start()

    decisions = []  # per update: (accepted [B], rewards [B], sequence_kl [B])
    loss = trainer.objective.loss

    def recording_loss(log_probs, rollouts, advantages, rewards, entropies=None):
        value, stats = loss(log_probs, rollouts, advantages, rewards, entropies)
        decisions.append((stats.accepted.clone(), rewards.clone(), stats.sequence_kl.clone()))
        return value, stats

    trainer.objective.loss = recording_loss
    print(f"{cfg.algo.name} delta={cfg.algo.delta} lag={local.policy_lag} seed={cfg.seed}: eval pass@1 "
          f"{trainer.evaluate()['eval/eval_tiny_pass1']:.3f} at start")
    print("updates   | accept(success) accept(failure) | KL(success) KL(failure) | success share: batch, admitted")
    for start in range(0, args.updates, 25):
        block = []
        for _ in range(min(25, args.updates - start)):
            trainer.step()
            block.append(decisions[-1])
        accepted = torch.cat([a for a, _, _ in block])
        success = torch.cat([r for _, r, _ in block]) > 0
        kl = torch.cat([k for _, _, k in block])

        def rate(selector):
            return f"{accepted[selector].float().mean():.3f}" if selector.any() else "  n/a"

        def mean_kl(selector):
            return f"{kl[selector].mean():.4f}" if selector.any() else "   n/a"

        admitted_success = success[accepted].float().mean() if accepted.any() else float("nan")
        print(f"{start + 1:>3}-{start + len(block):<5} | {rate(success):>15} {rate(~success):>15} | "
              f"{mean_kl(success):>11} {mean_kl(~success):>11} | {success.float().mean():.3f}, {admitted_success:.3f}")
    print(f"eval pass@1 after {trainer.version} updates: {trainer.evaluate()['eval/eval_tiny_pass1']:.3f}")


if __name__ == "__main__":
    main()
