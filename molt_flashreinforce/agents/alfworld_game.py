"""One ALFWorld (TextWorld PDDL) game, synchronous: start, reset, step, close.

Contract: ``resolve_game_file(label)`` turns a dataset ``game_file`` (relative to
``ALFWORLD_DATA``, or absolute) into an existing path or raises with the fix;
``AlfWorldGame(path)`` loads it with ALFWorld's own wrappers (entity names like ``apple 1``);
``reset()``/``step(command)`` return a ``GameStep``. Each live game holds a private copy of the
fast-downward planner library (so concurrent games do not share state). TextWorld loads a fresh
33 MB copy for every game, and unloading one (dlclose) crashes the process at exit, so
``close()`` frees the planner's state and parks the copy for the next game instead: there are
never more copies than games ever open at once. TextWorld parses every game with one
module-level PDDL parser that is not thread-safe, so games are loaded and stepped one at a time
(`_textworld_lock`); the event loop runs them on threads, many at once.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass

_idle_planners: list = []  # library copies of closed games, each ready for a new game
_idle_planners_lock = threading.Lock()
_textworld_lock = threading.Lock()


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
        _recycle_planner_copies()
        request = textworld.EnvInfos(won=True, admissible_commands=True)
        with _textworld_lock:
            self._env = textworld.start(game_file, request_infos=request, wrappers=[AlfredDemangler(), AlfredInfos])

    def reset(self) -> GameStep:
        with _textworld_lock:
            return self._game_step(self._env.reset(), done=False)

    def step(self, command: str) -> GameStep:
        with _textworld_lock:
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
        pddl_env = self._env.unwrapped
        with _textworld_lock:
            self._env.close()
        planner = getattr(pddl_env, "downward_lib", None)
        if planner is not None:
            planner.cleanup()
            pddl_env.downward_lib = None
            with _idle_planners_lock:
                _idle_planners.append(planner)


def _recycle_planner_copies() -> None:
    """Make TextWorld's per-game `fast_downward.load_lib()` hand out a parked copy when there is one."""
    import fast_downward

    load_new_copy = fast_downward.load_lib
    if getattr(load_new_copy, "recycles_planner_copies", False):
        return

    def load_or_reuse():
        with _idle_planners_lock:
            if _idle_planners:
                return _idle_planners.pop()
        return load_new_copy()

    load_or_reuse.recycles_planner_copies = True
    fast_downward.load_lib = load_or_reuse
