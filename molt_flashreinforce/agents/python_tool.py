"""Molt agent file (``--train.agent_path``): multi-turn math with a sandboxed Python tool."""

from molt.agents import StepEnvRunner

from molt_flashreinforce.agents.python_tool_env import PythonToolEnv


class AgentRunner(StepEnvRunner):
    def __init__(self):
        super().__init__(PythonToolEnv)
