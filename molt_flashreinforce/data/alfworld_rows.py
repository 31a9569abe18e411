"""List ALFWorld games of one split and turn them into Molt rows.

ALFWorld's data (``alfworld-download``) keeps each game as
``json_2.1.1/<split>/<task>/<trial>/game.tw-pddl`` next to ``traj_data.json``. Games are
taken the way ALFWorld's own loader takes them: skipping ``movable``/``Sliced`` tasks and
games not marked ``solvable``, in sorted path order. Rows store the path relative to the
data root, which the agent resolves against ``ALFWORLD_DATA`` on each worker. Each row's prompt
ends with a tag naming its game (``alfworld_protocol.game_prompt``; the agent removes it), so
that Molt, which tells an eval row's datasource by its prompt text, keeps seen and unseen apart.
"""

from __future__ import annotations

import json
import os

from molt_flashreinforce.agents.alfworld_protocol import game_prompt
from molt_flashreinforce.data.sources import SourceError

GAME_FILE = "game.tw-pddl"


def list_games(data_root: str, split: str) -> list[str]:
    split_dir = os.path.join(data_root, "json_2.1.1", split)
    if not os.path.isdir(split_dir):
        raise SourceError(
            f"{split_dir} does not exist: point --source alfworld=<dir> (or ALFWORLD_DATA) at the folder "
            "`alfworld-download` filled (it holds json_2.1.1/)."
        )
    games = []
    for root, _, files in os.walk(split_dir):
        if GAME_FILE not in files or "traj_data.json" not in files or "movable" in root or "Sliced" in root:
            continue
        path = os.path.join(root, GAME_FILE)
        with open(path, encoding="utf-8") as f:
            if not json.load(f).get("solvable", False):
                continue
        games.append(os.path.relpath(path, data_root))
    return sorted(games)


def alfworld_row(game_file: str, datasource: str) -> dict:
    return {"prompt": [{"role": "user", "content": game_prompt(game_file)}], "game_file": game_file, "datasource": datasource}
