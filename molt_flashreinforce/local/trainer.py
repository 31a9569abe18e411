"""One RL learner on one device: a fresh lag-k batch, exactly one optimizer step, discard.

    trainer = LocalTrainer(cfg, algo, seed)
    trainer.warm_start()               # optional supervised start (fresh runs only)
    metrics = trainer.step()           # {metric tag: value} for update number trainer.version
    evaluation = trainer.evaluate()    # held-out pass@1 at the eval temperature

`version` counts optimizer steps. Update v trains on a batch sampled, with stored log-probs, by
the policy snapshot of version max(0, v - policy_lag) (`snapshots.PolicySnapshots`). The batch is
B = `rollouts_per_step` trajectories: B / group_size prompts, each sampled group_size times.
The lag reads as in a Molt run (plugin/lag_bound.py): the update's number minus the version that
sampled the batch. Under `algo.max_policy_lag` N the lag must not exceed N (refused at
construction, since every batch here is exactly `policy_lag` updates old, so nothing is ever
dropped), and each update also logs `policy_lag_at_bound` and `policy_lag_dropped` (always 0).
Each update also counts tokens, cumulatively: generated = the batch's response tokens (its
mask), trained = its prompt tokens plus those response tokens.
`state_dict()` holds everything needed to continue bit-for-bit (weights, optimizer, snapshots,
random generators, counters).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from molt_flashreinforce import metrics as tags
from molt_flashreinforce.local.config import LocalConfig, LocalConfigError
from molt_flashreinforce.local.model import build_policy, response_log_probs
from molt_flashreinforce.local.objective import build_objective
from molt_flashreinforce.local.sampler import Rollouts, sample
from molt_flashreinforce.local.snapshots import PolicySnapshots
from molt_flashreinforce.local.task import AdditionTask, Problems


def _masked_mean(values: torch.Tensor, mask: torch.Tensor) -> float:
    return float((values * mask).sum() / mask.sum().clamp(min=1))


class LocalTrainer:
    def __init__(self, cfg: LocalConfig, algo: Any, seed: int) -> None:
        self.cfg = cfg
        self.device = torch.device(cfg.device)
        self.task = AdditionTask(cfg.task.max_operand, cfg.task.eval_size, cfg.task.eval_seed)
        self.objective = build_objective(algo)
        if cfg.rollouts_per_step % self.objective.group_size:
            raise LocalConfigError(
                f"local.rollouts_per_step={cfg.rollouts_per_step} is not a multiple of algo.group_size="
                f"{self.objective.group_size}; equal rollout budgets need B = prompts x group_size"
            )
        self.policy = build_policy(cfg.model, self.task, seed).to(self.device)
        self.behavior = build_policy(cfg.model, self.task, seed).to(self.device).requires_grad_(False)
        self.optimizer = torch.optim.AdamW(
            self.policy.parameters(), lr=cfg.lr, betas=cfg.adam_betas, weight_decay=cfg.weight_decay
        )
        self.max_policy_lag = algo.get("max_policy_lag") if hasattr(algo, "get") else getattr(algo, "max_policy_lag", None)
        if self.max_policy_lag is not None and cfg.policy_lag > self.max_policy_lag:
            raise LocalConfigError(
                f"local.policy_lag={cfg.policy_lag} exceeds algo.max_policy_lag={self.max_policy_lag}: every local batch "
                f"is exactly local.policy_lag updates old; lower local.policy_lag to at most {self.max_policy_lag}"
            )
        self.snapshots = PolicySnapshots(cfg.policy_lag)
        self.prompt_generator = torch.Generator().manual_seed(seed)
        self.sample_generator = torch.Generator(self.device).manual_seed(seed + 1)
        self.version = 0
        self.rollouts_consumed = 0
        self.generated_tokens = 0
        self.trained_tokens = 0
        self.snapshots.record(0, self.policy)

    def warm_start(self) -> tuple[float, int]:
        """Teacher-forced cross-entropy on the task's answers, for `warm_start.steps` steps or until
        `warm_start.target_pass1` is reached; returns the last batch's loss and the steps taken.
        Its own optimizer is discarded, and the result becomes policy version 0."""
        spec = self.cfg.warm_start
        optimizer = torch.optim.AdamW(self.policy.parameters(), lr=spec.lr, weight_decay=0.0)
        # The checks have their own generators, so they change neither training's batches nor RL's samples.
        check_problems = torch.Generator().manual_seed(self.cfg.task.eval_seed + 1)
        check_samples = torch.Generator(self.device).manual_seed(self.cfg.task.eval_seed + 2)
        self.policy.train()
        loss = torch.tensor(float("nan"))
        taken = 0
        for taken in range(1, spec.steps + 1):
            problems = self.task.sample_problems(spec.batch_size, self.prompt_generator)
            prompts = problems.prompt_ids.to(self.device)
            targets = self.task.answer_tokens(problems.answers).to(self.device)
            logits = self.policy(input_ids=torch.cat([prompts, targets], dim=1)).logits
            logits = logits[:, prompts.shape[1] - 1 : -1]
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                                   ignore_index=self.task.pad_id)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            if spec.target_pass1 is not None and taken % spec.check_every == 0:
                # Training problems, never the held-out ones.
                pass1 = self._sampled_pass1(self.task.sample_problems(spec.check_size, check_problems), check_samples)
                self.policy.train()
                if pass1 >= spec.target_pass1:
                    break
        self._become_version_0()
        return loss.item(), taken

    def warm_start_state(self) -> dict[str, Any]:
        """What a warm start changed: the policy and how far it drew training prompts."""
        return {"policy": self.policy.state_dict(), "prompt_generator": self.prompt_generator.get_state()}

    def load_warm_start(self, state: dict[str, Any]) -> None:
        """Continue as if `warm_start()` had just produced `state` (see `warm_start_state`)."""
        self.policy.load_state_dict(state["policy"])
        self.prompt_generator.set_state(state["prompt_generator"])
        self._become_version_0()

    def _become_version_0(self) -> None:
        self.policy.eval()
        self.snapshots.record(0, self.policy)

    def collect(self) -> tuple[Rollouts, torch.Tensor]:
        """The batch for update `version`, sampled by the snapshot `policy_lag` versions back."""
        behavior_version = self.snapshots.behavior_version(self.version)
        self.snapshots.load_into(self.behavior, behavior_version)
        group = self.objective.group_size
        problems = self.task.sample_problems(self.cfg.rollouts_per_step // group, self.prompt_generator)
        prompts = problems.prompt_ids.repeat_interleave(group, dim=0).to(self.device)
        rollouts = sample(self.behavior, prompts, self.task.max_new_tokens, self.cfg.temperature,
                          self.sample_generator, self.task.eos_id, self.task.pad_id, behavior_version)
        return rollouts, problems.answers.repeat_interleave(group)

    def update(self, rollouts: Rollouts, answers: torch.Tensor) -> dict[str, float]:
        """Exactly one optimizer step on this batch; the batch is not kept."""
        mask = rollouts.mask
        rewards = self.task.rewards(rollouts.response_ids.cpu(), answers).to(self.device)
        advantages = self.objective.advantages(rewards, mask)
        self.policy.train()
        log_probs, entropies = response_log_probs(self.policy, rollouts.prompt_ids, rollouts.response_ids,
                                                  self.cfg.temperature, self.objective.needs_entropies)
        loss, stats = self.objective.loss(log_probs, rollouts, advantages, rewards, entropies)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.policy.parameters(), self.cfg.max_grad_norm)
        self.optimizer.step()
        self.policy.eval()

        lag = self.version - rollouts.behavior_version
        self.version += 1
        self.rollouts_consumed += mask.shape[0]
        generated = int(mask.sum())
        self.generated_tokens += generated
        self.trained_tokens += rollouts.prompt_ids.numel() + generated  # prompts hold no padding
        self.snapshots.record(self.version, self.policy)

        lengths = mask.sum(dim=1).float()
        logged = {
            tags.REWARD_MEAN: float(rewards.mean()),
            tags.REWARD_STD: float(rewards.std()) if len(rewards) > 1 else 0.0,
            tags.ROLLOUT_PASS1: float(rewards.view(-1, self.objective.group_size).mean(dim=1).mean()),
            tags.NUM_ROLLOUTS: float(mask.shape[0]),
            tags.RESPONSE_LENGTH_MEAN: float(lengths.mean()),
            tags.TRUNCATED_RATE: float(rollouts.truncated.float().mean()),
            tags.POLICY_LOSS: stats.policy_loss,
            tags.ADVANTAGE_MEAN: _masked_mean(advantages, mask),
            tags.ACTOR_LR: self.optimizer.param_groups[0]["lr"],
            tags.ACTOR_GRAD_NORM: float(grad_norm),
            # Molt's vllm_kl: the k1 estimate of KL(mu || pi) from the stored sampling log-probs.
            tags.VLLM_KL: _masked_mean(rollouts.log_probs - log_probs.detach(), mask),
            tags.POLICY_LAG_MEAN: float(lag),
            tags.POLICY_LAG_MAX: float(lag),
            tags.ROLLOUTS_CONSUMED: float(self.rollouts_consumed),
            tags.GENERATED_TOKENS: float(self.generated_tokens),
            tags.TRAINED_TOKENS: float(self.trained_tokens),
        }
        if self.max_policy_lag is not None:
            logged[tags.POLICY_LAG_AT_BOUND] = float(lag == self.max_policy_lag)
            logged[tags.POLICY_LAG_DROPPED] = 0.0
        if stats.acceptance_rate is not None:
            logged[tags.ACCEPTANCE_RATE] = stats.acceptance_rate
            logged[tags.IS_FILTER_RATIO] = 1.0 - stats.acceptance_rate
            logged[tags.SEQUENCE_KL_MEAN] = float(stats.sequence_kl.mean())
            logged[tags.RETAINED_TOKEN_FRACTION] = stats.retained_token_fraction
        return logged

    def step(self) -> dict[str, float]:
        return self.update(*self.collect())

    @torch.no_grad()
    def evaluate(self, sampling_seed: int | None = None) -> dict[str, float]:
        """Mean reward over the held-out problems, one sample each at the eval temperature (avg@1).
        A fixed generator seed (`local.task.eval_seed` unless `sampling_seed` is given) makes it a
        deterministic function of the weights; other seeds measure the eval's sampling noise."""
        seed = self.cfg.task.eval_seed if sampling_seed is None else sampling_seed
        generator = torch.Generator(self.device).manual_seed(seed)
        return {tags.eval_pass1(self.cfg.task.datasource): self._sampled_pass1(self.task.eval_problems(), generator)}

    @torch.no_grad()
    def _sampled_pass1(self, problems: Problems, generator: torch.Generator) -> float:
        """Mean reward of one sample per problem from the current policy at the eval temperature."""
        self.policy.eval()
        rollouts = sample(self.policy, problems.prompt_ids.to(self.device), self.task.max_new_tokens,
                          self.cfg.eval.temperature, generator, self.task.eos_id, self.task.pad_id, self.version)
        return float(self.task.rewards(rollouts.response_ids.cpu(), problems.answers).mean())

    def state_dict(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "rollouts_consumed": self.rollouts_consumed,
            "generated_tokens": self.generated_tokens,
            "trained_tokens": self.trained_tokens,
            "policy": self.policy.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "snapshots": self.snapshots.state_dict(),
            "prompt_generator": self.prompt_generator.get_state(),
            "sample_generator": self.sample_generator.get_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.version = state["version"]
        self.rollouts_consumed = state["rollouts_consumed"]
        self.generated_tokens = state["generated_tokens"]
        self.trained_tokens = state["trained_tokens"]
        self.policy.load_state_dict(state["policy"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.snapshots.load_state_dict(state["snapshots"])
        self.prompt_generator.set_state(state["prompt_generator"])
        self.sample_generator.set_state(state["sample_generator"])
