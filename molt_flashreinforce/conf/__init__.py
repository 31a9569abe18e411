"""Hydra config tree of molt-flashreinforce (a package so `pkg://molt_flashreinforce.conf` resolves).

Importing it registers the resolvers the tree uses: `gpus_to_request:<rehearsal.mode>,<gpus>` is
the GPUs a launcher asks SLURM for, none for a CPU rehearsal (`rehearsal=cpu` runs on any node).

`experiments()` lists the experiment configs (`experiment/*.yaml`), `paper_experiments()` those
that run on Molt (every one but the CPU backend's): the one list the CLI, the docs and the tests use.
"""

from importlib import resources

from omegaconf import OmegaConf

OmegaConf.register_new_resolver("gpus_to_request", lambda mode, gpus: None if mode == "cpu" else gpus, replace=True)


def _experiment_files():
    return sorted((p for p in (resources.files(__name__) / "experiment").iterdir() if p.name.endswith(".yaml")),
                  key=lambda p: p.name)


def experiments() -> list[str]:
    return [p.name.removesuffix(".yaml") for p in _experiment_files()]


def paper_experiments() -> list[str]:
    """The experiments whose config keeps the default Molt backend (not `backend: local`)."""
    return [p.name.removesuffix(".yaml") for p in _experiment_files()
            if OmegaConf.create(p.read_text(encoding="utf-8")).get("backend", "molt") == "molt"]
