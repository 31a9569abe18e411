"""Single-turn math environment: 0/1 reward for the last ``\\boxed{}`` answer of the response.

``Result.info`` (numeric, logged by Molt): ``missing_answer``, ``grader_timeouts``,
``grader_rejected``, ``grader_restarts`` (``Grade.info``), ``turns`` (1). Grading runs off the
event loop (``grade_async``) under ``grading.grade``'s wall-clock bound.
"""

from __future__ import annotations

from molt.agents import Env, Result

from molt_flashreinforce.agents.grading import grade_async
from molt_flashreinforce.agents.labels import ground_truth
from molt_flashreinforce.metrics import TURNS, step_key


class MathEnv(Env):
    async def step(self, state: dict, **kwargs) -> Result:
        verdict = await grade_async(state["action_text"], ground_truth(state["label"]))
        return Result(
            reward=1.0 if verdict.correct else 0.0,
            terminated=True,
            info={**verdict.info(), step_key(TURNS): 1},
        )
