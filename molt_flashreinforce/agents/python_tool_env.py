"""Multi-turn Python tool environment: execute tool calls in the sandbox, grade the committed answer.

Each model turn either asks for tool calls (``python_tool_protocol``), which run in the
sandbox off the event loop (at most ``MAX_CALLS_PER_TURN`` per turn) and come back as the next observation (Molt masks observations
out of the loss), or commits a final answer, graded 0/1 on its last ``\\boxed{}``. Only the
committing turn is graded. After ``MAX_AGENT_TURNS`` model turns (default 10) without a
commitment the episode is truncated with reward 0.

Tool output is neutralised before it enters the trajectory (``python_tool_protocol``), with
the tokenizer's own added tokens when the runner knows them (``output_markers``). A failure of
the sandbox itself never ends the episode: the model gets a tool error and may try again.

``Result.info`` on every step (Molt keeps the last): ``tool_calls`` (programs executed),
``invalid_tool_calls``, ``tool_timeouts``, ``sandbox_errors`` (calls the sandbox could not
run), ``turns``, ``turn_limit_reached``, and ``Grade.info``'s ``missing_answer``, ``grader_timeouts``,
``grader_rejected``, ``grader_restarts`` (0 until the committing turn is graded).
"""

from __future__ import annotations

import logging

from molt.agents import Env, Result

from molt_flashreinforce.agents.chatml import next_user_turn, open_first_turn
from molt_flashreinforce.agents.grading import Grade, grade_async
from molt_flashreinforce.agents.labels import ground_truth
from molt_flashreinforce.agents.python_tool_protocol import parse_tool_calls, tool_response
from molt_flashreinforce.agents.sandbox import ExecutionResult, SandboxLimits, run_python_async
from molt_flashreinforce.agents.turns import max_agent_turns
from molt_flashreinforce.metrics import (INVALID_TOOL_CALLS, SANDBOX_ERRORS, TOOL_CALLS, TOOL_TIMEOUTS, TURN_LIMIT_REACHED,
                                         TURNS, step_key)

logger = logging.getLogger(__name__)

DEFAULT_MAX_TURNS = 10
# Parallel calls in one turn are allowed (Qwen templates emit them), but each may run for the
# full sandbox timeout, so a turn's extra calls get an error instead of a run.
MAX_CALLS_PER_TURN = 4


class PythonToolEnv(Env):
    output_markers: frozenset[str] = frozenset()  # the tokenizer's added tokens (python_tool.py)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.max_turns = max_agent_turns(DEFAULT_MAX_TURNS)
        self.limits = SandboxLimits.from_env()
        self.turns = 0
        self.tool_calls = 0
        self.invalid_tool_calls = 0
        self.tool_timeouts = 0
        self.sandbox_errors = 0

    def _info(self, **final) -> dict:
        info = {
            step_key(TOOL_CALLS): self.tool_calls,
            step_key(INVALID_TOOL_CALLS): self.invalid_tool_calls,
            step_key(TOOL_TIMEOUTS): self.tool_timeouts,
            step_key(SANDBOX_ERRORS): self.sandbox_errors,
            step_key(TURNS): self.turns,
            step_key(TURN_LIMIT_REACHED): 0,
            **Grade(correct=False, answer="").info(),
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
                info=self._info(**verdict.info()),
            )
        if self.turns >= self.max_turns:
            return Result(reward=0.0, terminated=False, truncated=True, info=self._info(turn_limit_reached=1))
        responses = []
        for index, call in enumerate(calls):
            if index >= MAX_CALLS_PER_TURN:
                self.invalid_tool_calls += 1
                refusal = f"Error: not run; at most {MAX_CALLS_PER_TURN} tool calls per turn."
                responses.append(tool_response(refusal, self.output_markers))
                continue
            if call.code is None:
                self.invalid_tool_calls += 1
                responses.append(tool_response(f"Error: {call.error}.", self.output_markers))
                continue
            result = await self._execute(call.code)
            self.tool_calls += 1
            self.tool_timeouts += int(result.timed_out)
            self.sandbox_errors += int(result.sandbox_error is not None)
            responses.append(tool_response(result.observation(self.limits.output_chars), self.output_markers))
        return Result(
            reward=0.0, observation=next_user_turn(action, "\n".join(responses)), terminated=False, info=self._info()
        )

    async def _execute(self, code: str) -> ExecutionResult:
        try:
            return await run_python_async(code, self.limits)
        except Exception as exc:  # noqa: BLE001 - the sandbox's failure is a tool error, not the episode's end
            logger.exception("Python sandbox call raised")
            return ExecutionResult("", "", None, False, False, 0.0, sandbox_error=f"{type(exc).__name__}: {exc}")
