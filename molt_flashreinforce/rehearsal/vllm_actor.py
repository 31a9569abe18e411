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
"""

from __future__ import annotations

import os

WORKER_EXTENSION = "molt_flashreinforce.rehearsal.vllm_worker.CpuWorkerWrap"
CPU_ENGINE_KWARGS = {"enforce_eager": True, "worker_extension_cls": WORKER_EXTENSION}
CPU_ENVIRONMENT = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind",
                   "VLLM_NO_USAGE_STATS": "1", "VLLM_DO_NOT_TRACK": "1"}


def ray_actor_class():
    import ray

    from molt_flashreinforce.plugin import seams

    class RolloutRayActor(seams.rollout_actor_class()):
        def __init__(self, *args, **kwargs):
            for name, value in CPU_ENVIRONMENT.items():
                os.environ.setdefault(name, value)
            super().__init__(*args, **{**kwargs, **CPU_ENGINE_KWARGS})

    return ray.remote(RolloutRayActor)
