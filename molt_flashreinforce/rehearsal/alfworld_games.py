"""Small real ALFWorld games, written locally: ALFWorld's own PDDL domain and grammar (from the
installed `alfworld` package) with a tiny hand-written problem each (one object, two
receptacles, three locations), in ALFWorld's data layout
(`json_2.1.1/<split>/<task>/<trial>/{game.tw-pddl, traj_data.json}`). Real ALFWorld data cannot
be downloaded here; TextWorld plays these exactly like the real games.

    Game(split, task_dir, obj, start, target, openable, goal)
    write_games(root, games)          writes each game under root
    rehearsal_games(count)            `count` distinct training games plus one per eval split
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

LOCATIONS = ["loc_bar_2_bar_2_bar_0_bar_45", "loc_bar_4_bar_1_bar_0_bar_45", "loc_bar_0_bar_1_bar_0_bar_45"]
_OBJECTS = ["Apple", "Mug", "Tomato", "Egg", "Potato", "Bread", "Cup", "Knife"]
_PLACES = [("CounterTop", "Fridge", ["Fridge"]), ("Fridge", "CounterTop", ["Fridge"]), ("CounterTop", "Shelf", []),
           ("Shelf", "Microwave", ["Microwave"]), ("DiningTable", "Cabinet", ["Cabinet"])]


@dataclass(frozen=True)
class Game:
    split: str
    task_dir: str
    obj: str
    start: str
    target: str
    openable: tuple[str, ...]
    goal: str


def _entity(kind: str, x: int) -> str:
    return f"{kind}_bar__plus_0{x}_dot_00_bar__plus_00_dot_90_bar__plus_01_dot_00"


def problem(game: Game) -> str:
    o, s, t = _entity(game.obj, 1), _entity(game.start, 2), _entity(game.target, 3)
    start_loc, near, far = LOCATIONS
    distances = "\n".join(f"(= (distance {a} {b}) 1)" for a in LOCATIONS for b in LOCATIONS if a != b)
    opens = "\n".join(f"(openable {_entity(r, 2 if r == game.start else 3)})" for r in game.openable)
    return f"""(define (problem plan_trial)
(:domain alfred)
(:objects
agent1 - agent
{game.obj}Type - otype
{game.start}Type - rtype
{game.target}Type - rtype
{o} - object
{s} - receptacle
{t} - receptacle
{start_loc} - location
{near} - location
{far} - location
)
(:init
(= (total-cost) 0)
{distances}
(atLocation agent1 {start_loc})
(receptacleAtLocation {s} {near})
(receptacleAtLocation {t} {far})
(objectAtLocation {o} {near})
(inReceptacle {o} {s})
(receptacleType {s} {game.start}Type)
(receptacleType {t} {game.target}Type)
(objectType {o} {game.obj}Type)
(canContain {game.start}Type {game.obj}Type)
(canContain {game.target}Type {game.obj}Type)
(pickupable {o})
(moveable {o})
{opens}
)
(:goal (and (exists (?r - receptacle) (exists (?o - object) (and (inReceptacle ?o ?r) (objectType ?o {game.obj}Type) (receptacleType ?r {game.target}Type))))))
(:metric minimize (total-cost))
)
"""


def write_games(root: str, games: list[Game]) -> None:
    import alfworld

    data = os.path.join(os.path.dirname(alfworld.__file__), "data")
    with open(os.path.join(data, "alfred.pddl"), encoding="utf-8") as f:
        domain = f.read()
    with open(os.path.join(data, "alfred.twl2"), encoding="utf-8") as f:
        grammar = f.read()
    for game in games:
        folder = os.path.join(root, "json_2.1.1", game.split, game.task_dir)
        os.makedirs(folder, exist_ok=True)
        record = {
            "pddl_domain": domain,
            "grammar": grammar.replace("UNKNOWN GOAL", game.goal),
            "pddl_problem": problem(game),
            "solvable": True,
        }
        with open(os.path.join(folder, "game.tw-pddl"), "w", encoding="utf-8") as f:
            json.dump(record, f)
        with open(os.path.join(folder, "traj_data.json"), "w", encoding="utf-8") as f:
            json.dump({"task_type": "pick_and_place_simple", "turk_annotations": {"anns": [{"task_desc": game.goal}]}}, f)


def rehearsal_games(count: int) -> list[Game]:
    """`count` distinct training games (object x placement), plus one valid_seen and one valid_unseen."""
    variants = [(obj, *place) for place in _PLACES for obj in _OBJECTS]
    if count > len(variants):
        raise ValueError(f"at most {len(variants)} distinct rehearsal games, asked for {count}")

    def game(split: str, index: int, obj: str, start: str, target: str, openable: list[str]) -> Game:
        task = f"pick_and_place_simple-{obj}-None-{target}-{index}/trial_T{index}"
        return Game(split, task, obj, start, target, tuple(openable), f"put a {obj.lower()} in {target.lower()}")

    train = [game("train", i, *variant) for i, variant in enumerate(variants[:count])]
    return [*train, game("valid_seen", 900, *variants[0]), game("valid_unseen", 901, *variants[-1])]
