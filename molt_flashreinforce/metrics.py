"""Metric (TensorBoard tag) names shared by every backend and by the report.

Molt's `TrainingActor` logs each step's dict under `train/<key>` and eval results under
`eval/<key>` (W&B and TensorBoard alike); the numeric `Result.info` keys of an agent and the
`Experience.info` keys of the loss become `train/<key>` too. The local CPU backend writes the same
tags, so one report reads both. Keep every tag this package writes or reads here, and write a
step key as `step_key(TAG)`.
"""

from __future__ import annotations

# ── rollout statistics (Molt: rl_trainer.py, the `rollout/*` keys) ──
REWARD_MEAN = "train/rollout/reward_mean"
REWARD_STD = "train/rollout/reward_std"
ROLLOUT_PASS1 = "train/rollout/pass1"
NUM_ROLLOUTS = "train/rollout/num_rollouts"
RESPONSE_LENGTH_MEAN = "train/rollout/response_length_mean"
TRUNCATED_RATE = "train/rollout/truncated_rate"
NUM_SAMPLES = "train/rollout/num_samples"  # generated rows (trajectories) the step's means are over

# ── step timing (Molt: rl_trainer.py, the `timing/*` keys; seconds) ──
# From the end of the previous training step (or of an eval) to the end of this one: waiting
# for rollouts plus the train step. The local backend logs the time of its sample-and-update.
STEP_TIME = "train/timing/step_total"

# ── actor statistics (Molt: policy_actor.py) ──
POLICY_LOSS = "train/policy_loss"
ADVANTAGE_MEAN = "train/advantage_mean"
ACTOR_LR = "train/actor_lr"
ACTOR_GRAD_NORM = "train/actor_grad_norm"
IS_FILTER_RATIO = "train/is_filter_ratio"  # fraction of trajectories the trust region rejected
VLLM_KL = "train/vllm_kl"
# Experience.total_length (prompt + response tokens), averaged over the trained samples
TOTAL_LENGTH_MEAN = "train/total_length"

# ── added by this package ──
ACCEPTANCE_RATE = "train/flashreinforce/acceptance_rate"  # 1 - is_filter_ratio
SEQUENCE_KL_MEAN = "train/flashreinforce/sequence_kl_mean"
RETAINED_TOKEN_FRACTION = "train/flashreinforce/retained_token_fraction"
# With --actor.loss_mode flashreinforce: 1.0 for a micro-batch whose log-probs the fused head computed
# inside the lm_head (plugin/seams.py `fusing_head`), 0.0 for one scored by Molt's own head; the
# step's value is their mean, so 1.0 means every micro-batch of the step ran the fused head.
FUSED_HEAD = "train/flashreinforce/fused_head"
POLICY_LAG_MEAN = "train/policy_lag_mean"
POLICY_LAG_MAX = "train/policy_lag_max"
ROLLOUTS_CONSUMED = "train/rollouts_consumed"  # cumulative trajectories trained on
POLICY_VERSIONS_MIXED = "train/policy_versions_mixed_fraction"  # trajectories spanning a refit
# With algo.max_policy_lag set (plugin/lag_bound.py): 1.0 when the step's oldest trajectory is exactly
# at the bound (its mean over steps is the fraction of steps at the bound), and the trajectories
# dropped for exceeding the bound while the step's batch was collected.
POLICY_LAG_AT_BOUND = "train/policy_lag_at_bound"
POLICY_LAG_DROPPED = "train/policy_lag_dropped"

# ── numeric agent `Result.info` keys (agents/*_env.py), per trajectory ──
TURNS = "train/turns"
TURN_LIMIT_REACHED = "train/turn_limit_reached"
TOOL_CALLS = "train/tool_calls"  # python tool: calls made, valid or not
INVALID_TOOL_CALLS = "train/invalid_tool_calls"
TOOL_TIMEOUTS = "train/tool_timeouts"
SANDBOX_ERRORS = "train/sandbox_errors"  # calls the sandbox could not run
WON = "train/won"  # ALFWorld: the game's goal reached
INVALID_ACTIONS = "train/invalid_actions"  # ALFWorld: actions the game did not admit
# The math grader's (agents/grading.py, Grade.info): 0/1 per graded rollout, so Molt's per-step
# mean is the fraction of the step's rollouts (count = mean x num_samples).
MISSING_ANSWER = "train/missing_answer"  # no final answer to grade
GRADER_TIMEOUTS = "train/grader_timeouts"  # overran the grading bound, queueing included
GRADER_REJECTED = "train/grader_rejected"  # refused by a static screen, never parsed
GRADER_RESTARTS = "train/grader_restarts"  # its grader process died and was replaced
# Cumulative token counts, written by the local backend; Molt logs none, so the report derives
# them for Molt runs from the per-step means above (report/cost.py).
GENERATED_TOKENS = "train/generated_tokens"  # response tokens sampled by the policy
TRAINED_TOKENS = "train/trained_tokens"  # prompt + response tokens through forward/backward


def step_key(tag: str) -> str:
    """The key of a step's status, a `Result.info` or an `Experience.info` that Molt logs as `tag`."""
    if not tag.startswith("train/"):
        raise ValueError(f"{tag} is not a train/ tag")
    return tag.removeprefix("train/")


def eval_pass1(datasource: str) -> str:
    """Mean over prompts of the mean reward of its eval samples (avg@n), per datasource."""
    return f"eval/eval_{datasource}_pass1"


def eval_pass1_stderr(datasource: str) -> str:
    """Standard error over prompts of `eval_pass1` (written by molt-flashreinforce-eval; Molt logs none)."""
    return f"eval/eval_{datasource}_pass1_stderr"
