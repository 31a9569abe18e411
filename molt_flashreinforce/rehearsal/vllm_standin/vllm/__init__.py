"""Rehearsal stand-in for the `vllm` package: only the names Molt's CPU-side modules import.

Molt's trainer modules import `vllm` at module level (`SamplingParams` in the samples generator,
the version check in the engine factory). The rehearsal puts this directory on the path of its
own processes only when no real vLLM is installed; generation itself is served by
`molt_flashreinforce.rehearsal.engine`, which takes the place of vLLM's engine actor.
"""

# The oldest vLLM Molt 0.2.1 accepts; the engine that answers is the rehearsal's, not vLLM's.
__version__ = "0.21.0"


class SamplingParams:
    """Holds the rollout's sampling settings; the rehearsal engine validates them per request."""

    def __init__(self, **settings):
        self.max_tokens = 16
        self.temperature = 1.0
        self.top_p = 1.0
        self.top_k = -1
        self.min_tokens = 0
        self.logprobs = None
        self.seed = None
        self.skip_special_tokens = True
        self.__dict__.update(settings)

