"""`python -m molt_flashreinforce.rehearsal.driver <Molt train_rl_ray flags>`: Molt's entry point
(`launch.molt_main`) with the rehearsal's stand-ins, on this machine's CPU.

The driver process gets the stand-ins first (`standins.install_driver`: vLLM's engine actor
becomes the one `rehearsal.engine` names, `standins.ENGINE_VARIABLE`) and, with rehearsal.float32
(`standins.FLOAT32_VARIABLE`), Molt's parsed flags get float32 arithmetic
(`standins.float32_arithmetic`); every Ray worker gets the stand-ins through the rehearsal's setup
hook, which then runs the plugin's own. Ray starts with logical GPUs (`MOLT_FLASHREINFORCE_REHEARSAL_GPUS`),
so Molt's GPU bundles, `num_gpus=1` actors and its over-subscription check all run unchanged.
On a multi-node allocation (RAY_ADDRESS set by `cluster.ray_nodes`) each node's `ray start` has
declared those logical resources (`rehearsal.run.REHEARSAL_NODE`), and the driver only connects.
The engine's decode delay (`engine.DECODE_DELAY_VARIABLE`), when exported, reaches the engine's worker;
vLLM's cache directories (`VLLM_CACHES`) reach the engine actor.
"""

from __future__ import annotations

import os

from molt_flashreinforce.rehearsal.engine import DECODE_DELAY_VARIABLE
from molt_flashreinforce.rehearsal.run import LOGICAL_GPUS_VARIABLE, RAY_CPUS
from molt_flashreinforce.rehearsal.standins import (ENGINE_VARIABLE, ENVIRONMENT, FLOAT32_VARIABLE, LOOPBACK,
                                                    SETUP_HOOK, float32_arithmetic, install_driver)

# vLLM's caches, which the rehearsal keeps in its run directory (or a shared compile cache).
VLLM_CACHES = ("VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR")


def main() -> None:
    from molt_flashreinforce.launch import molt_main

    install_driver(os.environ[ENGINE_VARIABLE])
    passthrough = ("GLOO_SOCKET_IFNAME", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "OMP_NUM_THREADS", "PYTHONPATH",
                   "RAY_prestart_worker_first_driver", DECODE_DELAY_VARIABLE, *VLLM_CACHES, *ENVIRONMENT)
    options: dict = {"env_vars": {name: os.environ[name] for name in passthrough if name in os.environ}}
    if "RAY_ADDRESS" not in os.environ:  # one node: this process starts Ray with the logical resources
        options.update(num_cpus=RAY_CPUS, num_gpus=int(os.environ[LOGICAL_GPUS_VARIABLE]), include_dashboard=False,
                       _node_ip_address=LOOPBACK)
    adjust_args = float32_arithmetic if os.environ.get(FLOAT32_VARIABLE) == "1" else None
    molt_main.main(setup_hook=SETUP_HOOK, ray_options=options, adjust_args=adjust_args)


if __name__ == "__main__":
    main()
