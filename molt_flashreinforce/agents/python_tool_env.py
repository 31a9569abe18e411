"""Multi-turn Python tool environment: execute tool calls in the sandbox, grade the committed answer.

Each model turn either asks for tool calls (``python_tool_protocol``), which run in the
sandbox off the event loop (at most ``MAX_CALLS_PER_TURN`` per turn) and come back as the next observation (Molt masks observations
out of the loss), or commits a final answer, graded 0/1 on its last ``\\boxed{}``. Only the
committing turn is graded. After ``MAX_AGENT_TURNS`` model turns (default 10) without a
commitment the episode is truncated with reward 0.

``Result.info`` on every step (Molt keeps the last): ``tool_calls`` (programs executed),
``invalid_tool_calls``, ``tool_timeouts``, ``turns``, ``turn_limit_reached``,
``missing_answer``, ``grader_timeout``.
"""

from __future__ import annotations

from molt.agents import Env, Result

from molt_flashreinforce.agents.chatml import next_user_turn, open_first_turn
from molt_flashreinforce.agents.grading import grade_async
from molt_flashreinforce.agents.labels import ground_truth
from molt_flashreinforce.agents.python_tool_protocol import parse_tool_calls, tool_response
from molt_flashreinforce.agents.sandbox import SandboxLimits, run_python_async
from molt_flashreinforce.agents.turns import max_agent_turns

DEFAULT_MAX_TURNS = 10
# Parallel calls in one turn are allowed (Qwen templates emit them), but each may run for the
# full sandbox timeout, so a turn's extra calls get an error instead of a run.
MAX_CALLS_PER_TURN = 4


class PythonToolEnv(Env):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.max_turns = max_agent_turns(DEFAULT_MAX_TURNS)
        self.limits = SandboxLimits.from_env()
        self.turns = 0
        self.tool_calls = 0
        self.invalid_tool_calls = 0
        self.tool_timeouts = 0

    def _info(self, **final) -> dict:
        info = {
            "tool_calls": self.tool_calls,
            "invalid_tool_calls": self.invalid_tool_calls,
            "tool_timeouts": self.tool_timeouts,
            "turns": self.turns,
            "turn_limit_reached": 0,
            "missing_answer": 0,
            "grader_timeout": 0,
        }
        info.update(final)
        return info

    async def reset(self, state: dict, **kwargs) -> dict:
        return {**state, "observation": open_first_turn(state["observation"])}

    async def step(self, state: dict, **kwargs) -> Result:
        self.turns += 1
        action = state["action_text"]
        calls = parse_tool_calls(action)
        if not calls:
            verdict = await grade_async(action, ground_truth(state["label"]))
            return Result(
                reward=1.0 if verdict.correct else 0.0,
                terminated=True,
                info=self._info(missing_answer=int(verdict.missing_answer), grader_timeout=int(verdict.timed_out)),
            )
        if self.turns >= self.max_turns:
            return Result(reward=0.0, terminated=False, truncated=True, info=self._info(turn_limit_reached=1))
        responses = []
        for index, call in enumerate(calls):
            if index >= MAX_CALLS_PER_TURN:
                self.invalid_tool_calls += 1
                responses.append(tool_response(f"Error: not run; at most {MAX_CALLS_PER_TURN} tool calls per turn."))
                continue
            if call.code is None:
                self.invalid_tool_calls += 1
                responses.append(tool_response(f"Error: {call.error}."))
                continue
            result = await run_python_async(call.code, self.limits)
            self.tool_calls += 1
            self.tool_timeouts += int(result.timed_out)
            responses.append(tool_response(result.observation(self.limits.output_chars)))
        return Result(
            reward=0.0, observation=next_user_turn(action, "\n".join(responses)), terminated=False, info=self._info()
        )
