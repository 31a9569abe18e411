"""`molt-flashreinforce-eval`: evaluate a model, an HF export or a Molt checkpoint under an
experiment's protocol, through the experiment's own agents and vLLM (docs/eval.md).

inputs.py (experiment config, protocol, benchmarks), models.py (what is evaluated),
checkpoint_export.py (Molt DCP -> HF), engine.py (vLLM's server), rollouts.py (samples through
Molt's runner), samples.py (samples.jsonl, resume), scores.py (avg@k and its standard error),
outputs.py (eval.json, events, .hydra/config.yaml), cli.py (the command).
"""
