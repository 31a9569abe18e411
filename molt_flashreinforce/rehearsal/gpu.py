"""`rehearsal=gpu`: the rehearsal's job on the GPUs of one node, with nothing stood in for.

    check_node(cfg)                  LaunchError unless this node can run it (CUDA, GPUs, vLLM)
    node_overrides(cfg, overrides)   rehearsal=cpu's overrides, made for one GPU node
    prepare_launch(job)              the job's environment for a real launch; returns its module
    gpus_needed(cfg)                 how many GPUs the rehearsal takes

It keeps what `rehearsal=cpu` changes (the tiny shape-card model, the generated data, the small
batches, `rehearsal.steps` steps and the final checkpoint) and drops only what exists because a
CPU has no CUDA: sdpa attention and unpacked samples (the experiment's flash-attention 2 and
packing run). The job goes through Molt's own entry point (`launch.molt_main`) exactly as a GPU
launch does: the plugin's setup hook alone, the real vLLM engines, vLLM's NCCL weight sync
(`--vllm.sync_backend nccl`), FSDP2 over NCCL on CUDA, Ray on this node's real GPUs.

Placement: the fewest GPUs Molt allows. Molt colocates only its FSDP models (actor, reference,
critic; `--train.colocate_fsdp_models`, and FlashREINFORCE and GRPO here build neither a
reference nor a critic), while its vLLM engines always take whole GPUs of their own
(`create_vllm_engines` reserves `{"GPU": TP}` bundles). So one policy GPU and one engine: 2 GPUs,
or 3 for the MoE experiment, which Molt builds only with expert parallelism (EP 2: two policy GPUs).

Nothing here imports torch or vLLM until `check_node` runs.
"""

from __future__ import annotations

import importlib.util

from omegaconf import DictConfig

from molt_flashreinforce.launch.errors import LaunchError

# What molt-rl 0.2.1 pins for a GPU node (its metadata): vllm==0.32.0 (extra vllm), flash-attn==2.8.3
# (extra flash-attn-2), ray[default]==2.59.0, transformers==5.18.0; NeMo AutoModel as scripts/setup.sh.
INSTALL_COMMAND = 'pip install "molt-rl[vllm,flash-attn-2]==0.2.1" "nemo-automodel==0.7.0" "molt-flashreinforce[molt,agents]"'
PINNED_VLLM = "0.32.0"
# Overrides rehearsal=cpu makes only because a CPU has no CUDA; rehearsal=gpu keeps the experiment's.
CPU_ONLY_KEYS = ("molt.fsdp.attn_implementation", "molt.fsdp.packing_samples")
# The environment of the Molt process: the tiny model and its tokenizer are local files.
ENVIRONMENT = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "RAY_DEDUP_LOGS": "0"}
REAL_PARTS = [
    "vLLM engines (RolloutRayActor, CUDA)",
    "vLLM's NCCL weight sync (StatelessProcessGroup + PyNccl)",
    "FSDP2 over NCCL on CUDA, with the experiment's attention implementation and packing",
    "Ray on this node's GPUs",
]


def _policy_gpus(cfg: DictConfig) -> int:
    # Molt builds MoE models only with expert parallelism: EP 2 over two policy GPUs.
    return 2 if int(cfg.placement.actor.ep) > 1 else 1


def placement_overrides(cfg: DictConfig) -> dict[str, object]:
    policy = _policy_gpus(cfg)
    return {
        "placement.nodes": 1,
        "placement.gpus_per_node": policy + 1,
        "placement.actor.nodes": 1,
        "placement.actor.gpus_per_node": policy,
        "placement.actor.tp": 1,
        "placement.actor.ep": policy,
        "placement.actor.cp": 1,
        "placement.vllm.engines": 1,
        "placement.vllm.tp": 1,
    }


def gpus_needed(cfg: DictConfig) -> int:
    return _policy_gpus(cfg) + 1


def node_overrides(cfg: DictConfig, overrides: dict[str, object]) -> dict[str, object]:
    """`overrides` (rehearsal=cpu's) without the CPU-only keys, on one node's fewest GPUs."""
    kept = {key: value for key, value in overrides.items() if key not in CPU_ONLY_KEYS}
    return {**kept, **placement_overrides(cfg)}


def check_node(cfg: DictConfig) -> None:
    """Refuse, in one line, a node that cannot run the rehearsal; warn about an unpinned vLLM."""
    import torch

    needed = gpus_needed(cfg)
    if not torch.cuda.is_available():
        raise LaunchError(f"rehearsal=gpu runs on CUDA GPUs ({needed} for experiment={cfg.experiment_name}), but "
                          "torch sees none here; on a machine without GPUs use rehearsal=cpu")
    found = torch.cuda.device_count()
    if found < needed:
        raise LaunchError(f"rehearsal=gpu needs {needed} GPUs on this node for experiment={cfg.experiment_name} "
                          f"(Molt gives its vLLM engine a GPU of its own), but torch sees {found}; run it on a "
                          "node with more GPUs, or use rehearsal=cpu")
    if importlib.util.find_spec("vllm") is None:
        raise LaunchError(f"rehearsal=gpu runs the real vLLM, which is not installed here; install what Molt 0.2.1 "
                          f"pins with: {INSTALL_COMMAND}")
    from importlib.metadata import version

    if version("vllm") != PINNED_VLLM:
        print(f"WARNING: vLLM {version('vllm')} is installed; Molt 0.2.1 pins vllm=={PINNED_VLLM} ({INSTALL_COMMAND})")


def prepare_launch(job) -> str:
    """Set the job's environment for the real launch and return the module to run: Molt's own
    entry point, whose Ray workers get the plugin's setup hook and nothing else."""
    from molt_flashreinforce.launch.render import MOLT_ENTRY_MODULE

    job.command.env.update(ENVIRONMENT)
    return MOLT_ENTRY_MODULE
