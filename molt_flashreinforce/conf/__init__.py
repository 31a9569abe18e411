"""Hydra config tree of molt-flashreinforce (a package so `pkg://molt_flashreinforce.conf` resolves).

Importing it registers the resolvers the tree uses: `gpus_to_request:<rehearsal.mode>,<gpus>` is
the GPUs a launcher asks SLURM for, none for a CPU rehearsal (`rehearsal=cpu` runs on any node).
"""

from omegaconf import OmegaConf

OmegaConf.register_new_resolver("gpus_to_request", lambda mode, gpus: None if mode == "cpu" else gpus, replace=True)
