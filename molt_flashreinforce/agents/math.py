"""Molt agent file (``--train.agent_path``): single-turn math, graded on the last ``\\boxed{}``."""

from molt.agents import StepEnvRunner

from molt_flashreinforce.agents.grading import POOL
from molt_flashreinforce.agents.math_env import MathEnv


class AgentRunner(StepEnvRunner):
    def __init__(self):
        POOL.warm_up()  # before the first rollout comes back
        super().__init__(MathEnv)
