"""Policy lag, bounded: `--flashreinforce.max_policy_lag N` (Hydra `algo.max_policy_lag`) inside Molt.

Reading of lag (the same as the probe's, plugin/policy_lag.py, and the local backend's): version v
is the weights after v optimizer updates, live in vLLM once `train_step` at global step v - 1 has
refit them. A trajectory's version is the one live when the generator dispatched it, so under
partial rollout, where a rollout keeps generating across refits, it is the version of its first
token or an older one; its lag is the global step that trains it minus that version. No
trajectory more than N updates old reaches the loss.

How, in Molt 0.2.1's async runtime (`HOOKS`, at Molt's seams in every worker, plugin/seams.py):

* A version board: a small named Ray actor per job (`PolicyVersionBoard`). `TrainingActor.fit`
  posts its starting step and, after each `train_step` (update and refit), the version now live.
* Generation is held back, as AReaL does: when `GenerateSamplesActor` takes a slot token for its
  next batch (before Molt takes the vLLM lock, so a refit is never blocked), it waits until the
  live version is at least `next_step + carry - N`. `next_step` is the step that will train the
  batch (Molt trains the non-empty batches in order, one step each) and `carry` the batches a
  rollout dispatched now can still wait in the in-flight pool before it is collected:
  ceil(vllm_generate_batch_size / batch_size) under partial rollout, 0 without (the pool is then
  drained every batch). Finished rollouts are collected oldest first (below), so one dispatched at
  or after that version is collected within `carry` batches and trains at most N updates later,
  unless it is still generating when its turn comes.
* First dispatched, first collected: Molt collects whichever finished rollout `ray.wait` returns,
  which among several finished ones is not the oldest, so a finished rollout could wait in the
  pool for many batches. When Molt hands a finished group over, the oldest finished one still in
  the pool is taken instead (the handed one goes back), as the arithmetic above assumes.
* Stragglers are dropped: a rollout that finishes later than `carry` batches (a slow trajectory
  overtaken by faster ones) would train more than N updates after its version. Its group is
  dropped when collected (Molt dispatches a fresh prompt in its place, so the batch keeps its
  size) and counted: `rollout/dropped/policy_lag` (Molt's own per-reason tag) and
  `policy_lag_dropped` (metrics.POLICY_LAG_DROPPED, every step) in the step's status.

Deadlock-free only when carry <= N (the gate would otherwise wait for a step that waits for this
batch); the launcher refuses other settings (launch/checks.py). Eval generation is not gated.
Groups restored by `--ckpt.warm_resume_rollouts` carry no version; the launcher refuses that flag
with a bound.
"""

from __future__ import annotations

import asyncio
import math

from molt_flashreinforce import metrics
from molt_flashreinforce.plugin.policy_lag import VERSION_ATTRIBUTE, max_policy_lag
from molt_flashreinforce.plugin.seams import RuntimeHooks

BOARD_NAME = "molt_flashreinforce_policy_versions"
DROP_REASON = "policy_lag"
DROPPED_KEY = metrics.step_key(metrics.POLICY_LAG_DROPPED)
_GATE_ATTRIBUTE = "_policy_lag_gate"
_BOARD_ATTRIBUTE = "_policy_version_board"


def carried_batches(args) -> int:
    """Batches a rollout dispatched now may wait in Molt's in-flight pool before it is collected."""
    groups = int(args.rollout.batch_size)
    in_flight = int(getattr(args.rollout, "vllm_generate_batch_size", None) or groups)
    if not getattr(args.train, "partial_rollout_enable", False):
        return 0
    return math.ceil(in_flight / groups)


def hold_back_version(next_step: int, carry: int, bound: int) -> int:
    """The version that must be live before collecting the batch that `next_step` trains."""
    return next_step + carry - bound


def is_stale(version: int, training_step: int, bound: int) -> bool:
    return training_step - version > bound


class PolicyVersionBoard:
    """The live policy version, posted by the trainer and awaited by the generator (a Ray async actor)."""

    def __init__(self) -> None:
        self._live: int | None = None
        self._changed = asyncio.Condition()

    async def start(self, version: int) -> None:
        async with self._changed:
            self._live = version
            self._changed.notify_all()

    async def went_live(self, version: int) -> None:
        async with self._changed:
            self._live = version if self._live is None else max(self._live, version)
            self._changed.notify_all()

    async def wait_until(self, version: int) -> int:
        """Return the live version once it is at least `version` (and the trainer has started)."""
        async with self._changed:
            await self._changed.wait_for(lambda: self._live is not None and self._live >= version)
            return self._live

    async def live(self) -> int:
        return await self.wait_until(-math.inf)


def board():
    """This job's board, created by whichever side asks first."""
    import ray

    return ray.remote(num_cpus=0)(PolicyVersionBoard).options(name=BOARD_NAME, get_if_exists=True).remote()


class LagGate:
    """The generator's side of the bound, attached to a `SamplesGenerator`."""

    def __init__(self, bound: int, carry: int, version_board) -> None:
        self.bound = bound
        self.carry = carry
        self.board = version_board
        self.next_step: int | None = None  # the step that trains the batch being collected
        self.collecting = False
        self.dropped = 0
        self.dispatch_versions: dict = {}  # in-flight rollout -> the version live at its dispatch
        self._dispatch_order: dict = {}  # in-flight rollout -> its dispatch number
        self._dispatched = 0

    def dispatched(self, refs, version: int) -> None:
        for ref in refs:
            self.dispatch_versions[ref] = version
            self._dispatch_order[ref] = self._dispatched
            self._dispatched += 1

    def oldest_finished(self, pool: list, handed):
        """The oldest finished rollout in `pool` dispatched before `handed` (which then takes its
        place in the pool), or `handed` itself."""
        import ray

        order = self._dispatch_order
        older = [ref for ref in pool if order.get(ref, math.inf) < order.get(handed, -math.inf)]
        finished = ray.wait(older, num_returns=len(older), timeout=0)[0] if older else []
        if not finished:
            return handed
        oldest = min(finished, key=order.__getitem__)
        pool[pool.index(oldest)] = handed
        return oldest

    def collected(self, ref) -> int | None:
        """The version of a collected rollout (None: not dispatched under the gate)."""
        self._dispatch_order.pop(ref, None)
        return self.dispatch_versions.pop(ref, None)

    def _ask(self, method: str, *args) -> int:
        import ray

        return ray.get(getattr(self.board, method).remote(*args))

    def live_version(self) -> int:
        return self._ask("live")

    def hold_back(self) -> None:
        """Block until the next batch may be collected without exceeding the bound."""
        if self.next_step is None:  # nothing trained yet: the trainer's starting step
            self.next_step = self.live_version()
        self._ask("wait_until", hold_back_version(self.next_step, self.carry, self.bound))


class HeldBackSlots:
    """Molt's `rollout_slots` queue as `GenerateSamplesActor` sees it: `get` also holds back."""

    def __init__(self, slots, gate: LagGate) -> None:
        self._slots = slots
        self._gate = gate

    def get(self, *args, **kwargs):
        token = self._slots.get(*args, **kwargs)
        self._gate.hold_back()
        return token

    def __getattr__(self, name):
        return getattr(self._slots, name)


def _gate(generator) -> LagGate | None:
    return generator.__dict__.get(_GATE_ATTRIBUTE)


def attach_gate(generator, args, version_board) -> LagGate | None:
    """Attach the bound's gate to a `SamplesGenerator` built from Molt's `args` (None when unbounded)."""
    bound = max_policy_lag(args)
    if bound is None:
        return None
    gate = LagGate(bound, carried_batches(args), version_board)
    setattr(generator, _GATE_ATTRIBUTE, gate)
    return gate


class LagBound(RuntimeHooks):
    """The bound's part at Molt's seams (plugin/seams.py); inert unless --flashreinforce.max_policy_lag."""

    def generator_actor_built(self, actor) -> None:
        if max_policy_lag(actor.args) is not None:
            gate = attach_gate(actor.samples_generator, actor.args, board())
            actor.rollout_slots = HeldBackSlots(actor.rollout_slots, gate)

    def batch_starting(self, generator) -> None:
        gate = _gate(generator)
        if gate is not None:
            if gate.next_step is None:
                gate.next_step = gate.live_version()
            gate.collecting, gate.dropped = True, 0

    def batch_ended(self, generator, samples, rollout_metrics) -> None:
        gate = _gate(generator)
        if gate is None:
            return
        gate.collecting = False
        if rollout_metrics is not None:
            rollout_metrics[DROPPED_KEY] = float(gate.dropped)
            if samples:  # Molt enqueues only non-empty batches, and trains each with one step
                gate.next_step += 1

    def dispatched(self, generator, refs, prompts) -> None:
        gate = _gate(generator)
        if gate is not None and gate.collecting:
            gate.dispatched(refs, gate.live_version())

    def choosing(self, generator, finished, pool):
        gate = _gate(generator)
        return gate.oldest_finished(pool, finished) if gate is not None and gate.collecting else finished

    def collected(self, generator, finished, samples, drop_counts):
        gate = _gate(generator)
        version = None if gate is None else gate.collected(finished)
        if version is None:
            return samples
        if samples and is_stale(version, gate.next_step, gate.bound):
            drop_counts[DROP_REASON] += len(samples)
            gate.dropped += len(samples)
            return []
        for sample in samples:
            setattr(sample, VERSION_ATTRIBUTE, version)
        return samples

    def training_starting(self, trainer, global_step) -> None:
        if max_policy_lag(trainer.args) is not None:
            import ray

            version_board = trainer.__dict__.setdefault(_BOARD_ATTRIBUTE, board())
            ray.get(version_board.start.remote(global_step))

    def train_step_ended(self, trainer, samples, global_step, status, next_step) -> None:
        version_board = trainer.__dict__.get(_BOARD_ATTRIBUTE)
        if version_board is not None:
            import ray

            ray.get(version_board.went_live.remote(next_step))


HOOKS = LagBound()
