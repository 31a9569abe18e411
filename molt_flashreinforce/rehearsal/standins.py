"""The rehearsal's stand-ins for what a CPU cannot run, installed only in rehearsal processes.

`install_worker()` is the rehearsal's Ray `worker_process_setup_hook` (`SETUP_HOOK`): it applies
the stand-ins below in every Ray worker, then runs the plugin's own `setup_worker` (registration,
the runtime patches, signal handling), so the plugin is active exactly as on a GPU. `install_driver()`
applies them in the driver and starts the rollout engine `rehearsal.engine` names: Molt's own
vLLM actor on vLLM's CPU build (`vllm_actor`), or the HF stand-in (`engine.CpuRolloutEngine`).
`standins(float32, engine)` is what the rehearsal summary lists. Everything else of Molt's runtime runs unmodified.
"""

from __future__ import annotations

import functools

SETUP_HOOK = "molt_flashreinforce.rehearsal.standins.install_worker"
LOOPBACK = "127.0.0.1"

# rehearsal.engine: which rollout engine a CPU rehearsal runs (ENGINE_VARIABLE tells the driver).
ENGINES = ("vllm", "standin")
ENGINE_VARIABLE = "MOLT_FLASHREINFORCE_REHEARSAL_ENGINE"
ENGINE_STANDINS = {
    "vllm": {
        "vLLM's CPU settings": "Molt's RolloutRayActor on vLLM's CPU build (rehearsal.vllm_actor): eager mode, a 1 GiB "
                               "KV cache, threads not pinned to cores; a tied lm_head re-packed after each refit "
                               "(a vLLM CPU bug)",
        "weight-sync communicator": "vLLM StatelessProcessGroup + PyNccl -> rehearsal.weight_sync.GlooBroadcastGroup; "
                                    "in vLLM's worker, Molt's WorkerWrap receives into a CPU buffer "
                                    "(rehearsal.vllm_worker.CpuWorkerWrap)",
    },
    "standin": {
        "vLLM engine": "RolloutRayActor -> rehearsal.engine.CpuRolloutEngine (HF transformers, KV-cached sampling, "
                       "same HTTP route)",
        "vLLM package": "the `vllm` module Molt imports -> rehearsal/vllm_standin (SamplingParams, version), when "
                        "vLLM is absent",
        "weight-sync communicator": "vLLM StatelessProcessGroup + PyNccl -> rehearsal.weight_sync.GlooBroadcastGroup",
    },
}
# What runs for real in place of the stand-in engine (the summary's `real` list).
VLLM_REAL_PARTS = [
    "vLLM 0.32.0 (CPU build): Molt's create_vllm_engines and RolloutRayActor, AsyncLLM with its EngineCore and "
    "Worker processes, vLLM's sampler and log-probs, its OpenAI server (serve_openai), Molt's WorkerWrap refit "
    "bookkeeping (layer-wise reload, missing-weight check, prefix-cache reset, pause and resume)",
]
STANDINS = {
    "NCCL": "torch.distributed nccl backend -> gloo (FSDP2, DTensor and device meshes on CPU)",
    "torch.cuda": "set_device/synchronize/empty_cache/memory stats -> no-ops; current_device -> cpu; cuda tensors -> cpu",
    "node address": "Ray's node IP -> 127.0.0.1, so every server Molt starts listens on the loopback",
    "MoE token dispatcher": "HybridEP (GPU kernels) -> NeMo AutoModel's torch dispatcher, via Molt's MOLT_MOE_DISPATCHER",
}
# rehearsal.float32 (on unless the experiment says otherwise): the driver edits Molt's parsed flags.
FLOAT32_VARIABLE = "MOLT_FLASHREINFORCE_REHEARSAL_FLOAT32"
FLOAT32_STANDIN = ("bf16 arithmetic", "--fsdp.param_dtype bf16 and --vllm.dtype bfloat16 -> float32 (a CPU without "
                   "bf16 units runs bf16 matmuls several times slower: benchmarks/bench_cpu_dtype.py)")


def standins(float32: bool, engine: str) -> dict[str, str]:
    """What a CPU rehearsal with rollout engine `engine` (`ENGINES`) stands in for, as its summary lists it."""
    return {**ENGINE_STANDINS[engine], **STANDINS, **dict([FLOAT32_STANDIN] if float32 else [])}
# Environment of every rehearsal process: Molt's own knob for the MoE dispatcher.
ENVIRONMENT = {"MOLT_MOE_DISPATCHER": "torch"}


class _CpuDevices:
    """Stands for the `torch` module inside Molt's policy actor: `torch.device("cuda", i)` is the CPU."""

    def __getattr__(self, name):
        import torch

        return getattr(torch, name)

    @staticmethod
    def device(kind, index=None):
        import torch

        kind = str(kind)
        return torch.device("cpu") if kind.startswith("cuda") else torch.device(kind) if index is None else torch.device(kind, index)

    def __reduce__(self):  # Ray ships actor methods by value, module globals included
        return (_CpuDevices, ())


def _patch_torch_cuda() -> None:
    import torch

    for name in ("set_device", "synchronize", "empty_cache", "reset_peak_memory_stats", "manual_seed", "manual_seed_all"):
        setattr(torch.cuda, name, lambda *args, **kwargs: None)
    for name in ("memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved"):
        setattr(torch.cuda, name, lambda *args, **kwargs: 0)
    torch.cuda.current_device = lambda: "cpu"
    torch.cuda.current_stream = lambda *args, **kwargs: None


def _patch_nccl() -> None:
    import torch.distributed as dist
    import torch.distributed.device_mesh as device_mesh

    if getattr(dist.init_process_group, "_rehearsal", False):
        return
    init_process_group, init_device_mesh = dist.init_process_group, device_mesh.init_device_mesh

    @functools.wraps(init_process_group)
    def gloo_process_group(*args, backend=None, **kwargs):
        return init_process_group(*args, backend="gloo", **kwargs)

    @functools.wraps(init_device_mesh)
    def cpu_device_mesh(device_type, *args, **kwargs):
        return init_device_mesh("cpu" if device_type.startswith("cuda") else device_type, *args, **kwargs)

    gloo_process_group._rehearsal = True
    dist.init_process_group = gloo_process_group
    device_mesh.init_device_mesh = cpu_device_mesh
    import nemo_automodel.components.distributed.mesh_utils as mesh_utils

    mesh_utils.init_device_mesh = cpu_device_mesh


def _patch_node_address() -> None:
    import ray._private.services as services
    import ray.util

    ray.util.get_node_ip_address = lambda *args, **kwargs: LOOPBACK
    services.get_node_ip_address = lambda *args, **kwargs: LOOPBACK


# Modules whose code names CUDA devices explicitly (`torch.device("cuda", i)`): their `torch` global
# becomes `_CpuDevices`, so those devices are the CPU.
CUDA_NAMING_MODULES = (
    "molt.trainer.workers.policy_actor",
    "nemo_automodel._transformers.auto_model",
    "nemo_automodel.components.models.qwen3_moe.model",
    "nemo_automodel.components.moe.state_dict_utils",
)


def _patch_device_names() -> None:
    import importlib

    from molt_flashreinforce.rehearsal import weight_sync

    for name in CUDA_NAMING_MODULES:
        importlib.import_module(name).torch = _CpuDevices()
    import molt.trainer.workers.policy_actor as policy_actor

    policy_actor.stateless_init_process_group = weight_sync.stateless_init_process_group


def _install_common() -> None:
    _patch_torch_cuda()
    _patch_nccl()
    _patch_node_address()
    _patch_device_names()


def install_worker() -> None:
    from molt_flashreinforce.plugin.ray_hooks import setup_worker

    _install_common()
    setup_worker()


def float32_arithmetic(args) -> None:
    """Molt's parsed flags with float32 weights in the trainer and the engine. Molt's parser offers
    only bf16 and fp16, while its dtype conversion (molt.utils.utils) takes fp32, so this edits the
    parsed flags before `train(args)` ships them to the actors."""
    args.fsdp.param_dtype = "fp32"
    args.vllm.dtype = "float32"


def install_driver(engine: str) -> None:
    """The stand-ins in the driver; Molt's engine actor becomes rollout engine `engine`'s."""
    from molt_flashreinforce.plugin import seams

    _install_common()
    if engine == "vllm":
        from molt_flashreinforce.rehearsal.vllm_actor import ray_actor_class
    else:
        from molt_flashreinforce.rehearsal.engine import ray_actor_class
    seams.replace_rollout_actor(ray_actor_class())
