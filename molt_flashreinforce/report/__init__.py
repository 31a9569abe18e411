"""Reproduce the paper's tables: reported numbers with their sources, and runs measured the same way.

`paper` loads the reported numbers (`paper_results.yaml`), `runs` finds Hydra run directories,
`events` reads their TensorBoard scalars, `protocol` measures a run the way the paper did,
`placement` reads the GPUs a run held from its launch record, `cost` adds up what a run had
spent by a step, `table` and `plot` render the comparison, and `cli` is `molt-flashreinforce-report`.
"""
