"""Molt agent file (``--train.agent_path``): ALFWorld household tasks, 0/1 reward on success."""

from molt.agents import StepEnvRunner

from molt_flashreinforce.agents.alfworld_env import AlfWorldEnv


class AgentRunner(StepEnvRunner):
    def __init__(self):
        super().__init__(AlfWorldEnv)
