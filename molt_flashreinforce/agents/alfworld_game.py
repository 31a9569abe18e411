"""One ALFWorld (TextWorld PDDL) game, synchronous: start, reset, step, close.

Contract: ``resolve_game_file(label)`` turns a dataset ``game_file`` (relative to
``ALFWORLD_DATA``, or absolute) into an existing path or raises with the fix;
``AlfWorldGame(path)`` loads it with ALFWorld's own wrappers (entity names like ``apple 1``);
``reset()``/``step(command)`` return a ``GameStep``. Each game loads a private copy of the
fast-downward planner library (so concurrent games do not share state); ``close()`` unloads
it, or every episode would leak tens of megabytes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


class AlfWorldDataError(RuntimeError):
    """The ALFWorld games are not where the dataset says."""


@dataclass(frozen=True)
class GameStep:
    observation: str
    admissible: list[str]
    won: bool
    done: bool


def resolve_game_file(label) -> str:
    if not isinstance(label, str) or not label.strip():
        raise AlfWorldDataError(
            f"ALFWorld label {label!r} is not a game file path: prepare the data with "
            "`molt-flashreinforce-data alfworld_qwen2p5_7b` and pass --data.label_key game_file."
        )
    path = label
    if not os.path.isabs(path):
        root = os.environ.get("ALFWORLD_DATA")
        if not root:
            raise AlfWorldDataError(
                "ALFWORLD_DATA is not set: download the games with `alfworld-download` and export "
                "ALFWORLD_DATA=<that folder> on every Ray worker (game files are stored relative to it)."
            )
        path = os.path.join(root, path)
    if not os.path.isfile(path):
        raise AlfWorldDataError(
            f"ALFWorld game file {path} does not exist: check ALFWORLD_DATA "
            f"({os.environ.get('ALFWORLD_DATA')!r}) and that `alfworld-download` finished."
        )
    return path


class AlfWorldGame:
    def __init__(self, game_file: str):
        try:
            import textworld
            from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredInfos
        except ImportError as exc:
            raise ImportError(
                "The ALFWorld agent needs the alfworld package: pip install 'molt-flashreinforce[alfworld]'."
            ) from exc
        request = textworld.EnvInfos(won=True, admissible_commands=True)
        self._env = textworld.start(game_file, request_infos=request, wrappers=[AlfredDemangler(), AlfredInfos])

    def reset(self) -> GameStep:
        return self._game_step(self._env.reset(), done=False)

    def step(self, command: str) -> GameStep:
        state, _, done = self._env.step(command)
        return self._game_step(state, done=done)

    @staticmethod
    def _game_step(state, done: bool) -> GameStep:
        return GameStep(
            observation=state.feedback,
            admissible=list(state["admissible_commands"]),
            won=bool(state["won"]),
            done=bool(done),
        )

    def close(self):
        from fast_downward import close_lib

        pddl_env = self._env.unwrapped
        self._env.close()
        if getattr(pddl_env, "downward_lib", None) is not None:
            close_lib(pddl_env.downward_lib)
            pddl_env.downward_lib = None
