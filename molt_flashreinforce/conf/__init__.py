"""Hydra config tree of molt-flashreinforce (a package so `pkg://molt_flashreinforce.conf` resolves)."""
