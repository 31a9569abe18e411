"""FlashREINFORCE for NVIDIA Molt: the loss, its Molt plugin, a Hydra front end and a CPU backend.

    import molt_flashreinforce
    molt_flashreinforce.register()   # Molt's estimator and loss registries, in this process

The loss itself is `molt_flashreinforce.objective`; the Ray worker hooks are in
`molt_flashreinforce.plugin`.
"""

__version__ = "0.1.0"


def register() -> None:
    """Register advantage estimator and policy loss `flashreinforce` in Molt (idempotent)."""
    from molt_flashreinforce.plugin import register as register_in_molt

    register_in_molt()
