"""`python -m molt_flashreinforce.rehearsal.driver <Molt train_rl_ray flags>`: Molt's entry point
(`launch.molt_main`) with the rehearsal's stand-ins, on this machine's CPU.

The driver process gets the stand-ins first (`standins.install_driver`: vLLM's engine actor
becomes the CPU engine); every Ray worker gets them through the rehearsal's setup hook, which
then runs the plugin's own. Ray starts with logical GPUs (`MOLT_FLASHREINFORCE_REHEARSAL_GPUS`),
so Molt's GPU bundles, `num_gpus=1` actors and its over-subscription check all run unchanged.
The engine's decode delay (`engine.DECODE_DELAY_VARIABLE`), when exported, reaches the engine's worker.
"""

from __future__ import annotations

import os

from molt_flashreinforce.rehearsal.engine import DECODE_DELAY_VARIABLE
from molt_flashreinforce.rehearsal.run import LOGICAL_GPUS_VARIABLE
from molt_flashreinforce.rehearsal.standins import ENVIRONMENT, LOOPBACK, SETUP_HOOK, install_driver

RAY_CPUS = 8  # logical: one per actor Molt starts, all sharing this machine's cores


def main() -> None:
    from molt_flashreinforce.launch import molt_main

    install_driver()
    passthrough = ("GLOO_SOCKET_IFNAME", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "OMP_NUM_THREADS", "PYTHONPATH",
                   "RAY_prestart_worker_first_driver", DECODE_DELAY_VARIABLE, *ENVIRONMENT)
    molt_main.main(
        setup_hook=SETUP_HOOK,
        ray_options={
            "num_cpus": RAY_CPUS,
            "num_gpus": int(os.environ[LOGICAL_GPUS_VARIABLE]),
            "include_dashboard": False,
            "_node_ip_address": LOOPBACK,
            "env_vars": {name: os.environ[name] for name in passthrough if name in os.environ},
        },
    )


if __name__ == "__main__":
    main()
