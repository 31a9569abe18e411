"""Multi-turn ALFWorld environment: one game per episode, 0/1 reward from the game's ``won``.

``reset`` drops the prompt's game tag (alfworld_protocol), starts the game named by the row's
``game_file`` label and puts its opening text and admissible actions into the prompt's
``OBSERVATION_SLOT``. Each model turn's last
``<action>`` is played (a turn without one gets a format reminder and costs the turn);
the game's reply and the admissible actions come back as the next observation (masked out
of the loss by Molt). The episode ends with reward 1 when the game is won, 0 when it ends
otherwise, and is truncated with reward 0 after ``MAX_AGENT_TURNS`` turns (default 50).
Game calls run on this module's thread pool (``ALFWORLD_THREADS``, default 16), off Molt's
event loop and its default executor.

``Result.info``: ``won``, ``turns``, ``invalid_actions``, ``turn_limit_reached``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import os

from molt.agents import Env, Result

from molt_flashreinforce.agents.alfworld_game import AlfWorldGame, resolve_game_file
from molt_flashreinforce.agents.alfworld_protocol import OBSERVATION_SLOT, describe, parse_action, untagged
from molt_flashreinforce.agents.chatml import next_user_turn
from molt_flashreinforce.agents.turns import max_agent_turns
from molt_flashreinforce.metrics import INVALID_ACTIONS, TURN_LIMIT_REACHED, TURNS, WON, step_key

DEFAULT_MAX_TURNS = 50
FORMAT_REMINDER = "Invalid format: give exactly one command inside <action></action>."
_THREADS = concurrent.futures.ThreadPoolExecutor(
    max_workers=int(os.environ.get("ALFWORLD_THREADS", "16")), thread_name_prefix="alfworld"
)


async def _in_thread(fn, *args):
    return await asyncio.get_running_loop().run_in_executor(_THREADS, functools.partial(fn, *args))


class AlfWorldEnv(Env):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.max_turns = max_agent_turns(DEFAULT_MAX_TURNS)
        self.game: AlfWorldGame | None = None
        self.turns = 0
        self.invalid_actions = 0

    async def reset(self, state: dict, **kwargs) -> dict:
        prompt = untagged(state["observation"])
        if OBSERVATION_SLOT not in prompt:
            raise ValueError(
                f"The ALFWorld prompt lacks the {OBSERVATION_SLOT} slot for the game's opening text: "
                "prepare the data with `molt-flashreinforce-data alfworld_qwen2p5_7b`."
            )
        game_file = resolve_game_file(state["label"])
        self.game = await _in_thread(AlfWorldGame, game_file)
        opening = await _in_thread(self.game.reset)
        return {**state, "observation": prompt.replace(OBSERVATION_SLOT, describe(opening.observation, opening.admissible))}

    def _info(self, won: bool = False, turn_limit_reached: bool = False) -> dict:
        return {
            step_key(WON): int(won),
            step_key(TURNS): self.turns,
            step_key(INVALID_ACTIONS): self.invalid_actions,
            step_key(TURN_LIMIT_REACHED): int(turn_limit_reached),
        }

    async def step(self, state: dict, **kwargs) -> Result:
        self.turns += 1
        action_text = state["action_text"]
        command = parse_action(action_text)
        if command is None:
            self.invalid_actions += 1
            feedback = FORMAT_REMINDER
        else:
            played = await _in_thread(self.game.step, command)
            if played.won or played.done:
                return Result(reward=1.0 if played.won else 0.0, terminated=True, info=self._info(won=played.won))
            feedback = describe(played.observation, played.admissible)
        if self.turns >= self.max_turns:
            return Result(reward=0.0, terminated=False, truncated=True, info=self._info(turn_limit_reached=True))
        return Result(reward=0.0, observation=next_user_turn(action_text, feedback), terminated=False, info=self._info())

    async def close(self):
        if self.game is not None:
            await _in_thread(self.game.close)
            self.game = None
