"""Data preparation: each experiment's public data in Molt's prompt-dataset format.

``molt-flashreinforce-data <experiment> --out DATA_DIR`` writes
``DATA_DIR/<experiment>/{train,eval}.jsonl`` (see cli.py and docs/agents.md).
"""
