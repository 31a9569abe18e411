"""FlashREINFORCE for NVIDIA Molt: the loss, its Molt plugin, a Hydra front end and a CPU backend."""

__version__ = "0.1.0"
