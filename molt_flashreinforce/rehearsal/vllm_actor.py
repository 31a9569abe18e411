"""Molt's vLLM engine actor on vLLM's CPU build, for `rehearsal.engine=vllm`.

    ray_actor_class()   a Ray actor class that Molt's `create_vllm_engines` starts in place of its own

The class is Molt's `RolloutRayActor` (the class Ray captured, subclassed), so its AsyncLLM
engine, `serve_openai` (vLLM's OpenAI server with Molt's token-in/token-out route), pause and
resume, prefix-cache reset and refit RPCs all run as on a GPU. It changes only the engine's
keyword arguments a CPU needs (`CPU_ENGINE_KWARGS`): eager mode (compiling gains nothing on a
CPU and costs a minute), and the worker extension `rehearsal.vllm_worker.CpuWorkerWrap` (Molt's
`WorkerWrap` with a gloo transport). vLLM's CPU build turns Molt's `uni` executor into `mp`, so
each engine is three processes: this actor, vLLM's EngineCore, and its Worker.

The CPU's environment (`CPU_ENVIRONMENT`, set in the actor's process before the engine starts,
so its EngineCore and Worker inherit it): a KV cache of 1 GiB (otherwise vLLM reserves
`gpu_memory_utilization` of the machine's memory), OpenMP threads not pinned to cores (the
machine's cores are shared with the trainer), no usage reports. Its caches (`VLLM_CACHE_ROOT`,
`TORCHINDUCTOR_CACHE_DIR`) come from the rehearsal's environment (`rehearsal.run`).

Every refit is checked once generation resumes: the engine's log-probs of a fixed token sequence
(`PROBE`, through its own sampler path: prompt log-probs) must equal Hugging Face's float32 forward
of the weights the refit sent (`CpuWorkerWrap.refit_reference`) within `TOLERANCE` of the engine's
dtype, and a refit whose sent weights moved the reference beyond that while the engine's log-probs
did not move at all is stale. Either stops the run (`RefitMismatch`, one line), and under the
supervisor it is not restarted (`cluster.progress.record_lasting_failure`).
"""

from __future__ import annotations

import os

WORKER_EXTENSION = "molt_flashreinforce.rehearsal.vllm_worker.CpuWorkerWrap"
CPU_ENGINE_KWARGS = {"enforce_eager": True, "worker_extension_cls": WORKER_EXTENSION}
CPU_ENVIRONMENT = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind",
                   "VLLM_NO_USAGE_STATS": "1", "VLLM_DO_NOT_TRACK": "1"}
PROBE = list(range(100, 132))  # token ids every card's vocabulary has
# Largest |log-prob difference| allowed between the engine and the reference, by the engine's dtype:
# float32 agrees to about 2e-6 (tests/test_rehearsal_vllm_worker.py); bf16 engines differ from a
# float32 forward by up to about 0.04 nats per token.
TOLERANCE = {"float32": 1e-4, "bfloat16": 0.25, "float16": 0.25}


class RefitMismatch(RuntimeError):
    """The engine's weights after a refit are not the ones sent (the message is one line)."""


def check_refit(refit: int, engine: list[float], reference: list[float], tolerance: float,
                previous: tuple[list[float], list[float]] | None) -> None:
    """Raise `RefitMismatch` unless the engine's probe log-probs match the reference's within
    `tolerance` and moved if the sent weights moved (`previous`: the last refit's engine, reference).
    Under the supervisor the mismatch is first recorded as a fault no restart mends: the next
    attempt's refits would land the same way."""
    from molt_flashreinforce.cluster.progress import record_lasting_failure

    def mismatch(message: str) -> RefitMismatch:
        record_lasting_failure("vLLM's engine (RolloutRayActor)", message)
        return RefitMismatch(message)

    def largest_gap(left, right):
        return max(abs(a - b) for a, b in zip(left, right))

    # A step small enough to move the log-probs less than the engine's precision cannot be told from
    # a stale refit; one that moves them more must move the engine's.
    if previous is not None and engine == previous[0] and largest_gap(reference, previous[1]) > tolerance:
        raise mismatch(f"refit {refit}: the weights sent moved the probe's log-probs by up to "
                            f"{largest_gap(reference, previous[1]):.3g} nats and the engine's not at all; the refit "
                            "landed stale weights")
    gap = largest_gap(engine, reference)
    if gap > tolerance:
        raise mismatch(f"refit {refit}: the engine's log-probs on the probe differ from the weights sent by up to "
                            f"{gap:.3g} nats (tolerance {tolerance:g}); the engine serves other weights than the trainer's")


def ray_actor_class():
    import ray

    from molt_flashreinforce.plugin import seams

    class RolloutRayActor(seams.rollout_actor_class()):
        def __init__(self, *args, **kwargs):
            for name, value in CPU_ENVIRONMENT.items():
                os.environ.setdefault(name, value)
            super().__init__(*args, **{**kwargs, **CPU_ENGINE_KWARGS})
            self._refits, self._refit_to_check, self._last_probe = 0, False, None

        async def end_weight_update(self):
            await super().end_weight_update()
            self._refit_to_check = True

        async def resume_generation(self):
            await super().resume_generation()
            if self._refit_to_check:
                self._refit_to_check, self._refits = False, self._refits + 1
                engine = await self._probe_log_probs()
                (reference,) = await self.llm.collective_rpc("refit_reference", args=(PROBE,))
                dtype = str(self.llm.model_config.dtype).removeprefix("torch.")
                check_refit(self._refits, engine, reference, TOLERANCE[dtype], self._last_probe)
                self._last_probe = (engine, reference)

        async def _probe_log_probs(self) -> list[float]:
            from vllm import SamplingParams, TokensPrompt

            final = None
            async for output in self.llm.generate(TokensPrompt(prompt_token_ids=PROBE),
                                                  SamplingParams(max_tokens=1, prompt_logprobs=0),
                                                  request_id=f"refit-probe-{self._refits}"):
                final = output
            return [entry[token].logprob for entry, token in zip(final.prompt_logprobs[1:], PROBE[1:])]

    return ray.remote(RolloutRayActor)
