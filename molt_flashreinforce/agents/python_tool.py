"""Molt agent file (``--train.agent_path``): multi-turn math with a sandboxed Python tool.

Each runner gets its own ``PythonToolEnv`` subclass, which learns the rollout tokenizer's
added tokens on the first episode, so tool output cannot smuggle any of them in.
"""

from molt.agents import StepEnvRunner

from molt_flashreinforce.agents.grading import POOL
from molt_flashreinforce.agents.python_tool_env import PythonToolEnv
from molt_flashreinforce.agents.python_tool_protocol import tokenizer_markers


class AgentRunner(StepEnvRunner):
    def __init__(self):
        POOL.warm_up()  # before the first rollout comes back
        super().__init__(type("RunnerPythonToolEnv", (PythonToolEnv,), {}))

    async def execute(self, prompt, label, sampling_params, max_length, hf_tokenizer, llm_engine, **kwargs):
        if not self.env_cls.output_markers:
            self.env_cls.output_markers = tokenizer_markers(hf_tokenizer)
        return await super().execute(prompt, label, sampling_params, max_length, hf_tokenizer, llm_engine, **kwargs)
