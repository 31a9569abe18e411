"""The ALFWorld agent under Molt's own runner loop, on hand-made games.

Real ALFWorld data cannot be downloaded here, so tests/fixtures/agents/alfworld_data holds
three tiny real TextWorld PDDL games in ALFWorld's layout (see its make_games.py), played by
the real ``alfworld``/``textworld`` packages. The agent file is loaded with Molt's
``load_agent_runner`` and driven by Molt's ``StepEnvRunner.execute``; a scripted policy stands
in for vLLM's router client (no GPU or vLLM here, see tests/fixtures/agents/molt_harness.py).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from molt.agents.base import load_agent_runner

from molt_flashreinforce.agents import agent_path
from molt_flashreinforce.agents.alfworld_game import AlfWorldDataError, resolve_game_file
from molt_flashreinforce.agents.alfworld_protocol import INSTRUCTIONS, OBSERVATION_SLOT, describe, game_prompt, parse_action

_spec = importlib.util.spec_from_file_location(
    "molt_harness", Path(__file__).parent / "fixtures" / "agents" / "molt_harness.py"
)
harness = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(harness)

DATA = Path(__file__).parent / "fixtures" / "agents" / "alfworld_data"
TRAIN_GAME = "json_2.1.1/train/pick_and_place_simple-Apple-None-Fridge-1/trial_T1/game.tw-pddl"
PROMPT = harness.chat_prompt(None, INSTRUCTIONS)
OPENING = (
    "You are in the middle of a room. Looking quickly around you, you see a countertop 1, and a fridge 1.\n\n"
    "Your task is to: put an apple in fridge.\n\n"
    "Admissible actions: go to countertop 1, go to fridge 1, inventory, look"
)
SOLUTION = [
    "go to countertop 1",
    "take apple 1 from countertop 1",
    "go to fridge 1",
    "open fridge 1",
    "move apple 1 to fridge 1",
]


def act(command: str) -> str:
    return f"I should {command}.\n<action>{command}</action><|im_end|>"


@pytest.fixture(scope="module")
def tokenizer():
    return harness.byte_tokenizer()


@pytest.fixture()
def runner(monkeypatch):
    pytest.importorskip("alfworld", reason="pip install 'molt-flashreinforce[alfworld]'")
    monkeypatch.setenv("ALFWORLD_DATA", str(DATA))
    monkeypatch.setenv("MAX_AGENT_TURNS", "50")
    return load_agent_runner(agent_path("alfworld"))


def test_solving_the_game_gives_reward_one_and_masks_the_game_text(runner, tokenizer):
    actions = [act(c) for c in SOLUTION]
    # The data command's prompt, whose game tag (there for Molt's per-datasource eval) the model never sees.
    tagged = harness.chat_prompt(None, game_prompt(TRAIN_GAME))
    assert tagged != PROMPT and TRAIN_GAME in tagged
    trajectory, policy = harness.run_episode(runner, tokenizer, list(actions), TRAIN_GAME, tagged)
    assert trajectory.reward == 1.0 and not trajectory.truncated
    assert trajectory.extra_logs == {"won": 1, "turns": 5, "invalid_actions": 0, "turn_limit_reached": 0}
    first_prompt = PROMPT.replace(OBSERVATION_SLOT, OPENING)
    assert policy.prompts[0] == first_prompt
    assert "You arrive at countertop 1. On the countertop 1, you see a apple 1." in policy.prompts[1]
    assert "take apple 1 from countertop 1" in policy.prompts[1].rsplit("Admissible actions:", 1)[1]
    trained, masked, _ = harness.split_by_mask(trajectory, tokenizer)
    assert trained == "".join(actions)
    assert masked.startswith(first_prompt) and "Admissible actions" in masked[len(first_prompt):]
    assert len(trajectory.action_ranges) == 5


def test_wandering_hits_the_turn_limit_with_zero_reward(runner, tokenizer, monkeypatch):
    monkeypatch.setenv("MAX_AGENT_TURNS", "4")
    limited = load_agent_runner(agent_path("alfworld"))
    actions = [act("look"), "<action>jump around</action><|im_end|>", "hmm<|im_end|>", act("go to fridge 1"), act("look")]
    trajectory, policy = harness.run_episode(limited, tokenizer, actions, TRAIN_GAME, PROMPT)
    assert len(policy.prompts) == 4
    assert trajectory.truncated and trajectory.reward == 0.0
    assert trajectory.extra_logs == {"won": 0, "turns": 4, "invalid_actions": 1, "turn_limit_reached": 1}
    assert "Nothing happens." in policy.prompts[2]  # an inadmissible command is played, not refused
    assert "Invalid format" in policy.prompts[3]


def test_each_split_game_is_playable(runner, tokenizer):
    for game, steps in [
        ("json_2.1.1/valid_seen/pick_and_place_simple-Apple-None-CounterTop-2/trial_T2/game.tw-pddl",
         ["go to fridge 1", "open fridge 1", "take apple 1 from fridge 1", "go to countertop 1", "move apple 1 to countertop 1"]),
        ("json_2.1.1/valid_unseen/pick_and_place_simple-Mug-None-Shelf-3/trial_T3/game.tw-pddl",
         ["go to countertop 1", "take mug 1 from countertop 1", "go to shelf 1", "move mug 1 to shelf 1"]),
    ]:
        trajectory, _ = harness.run_episode(runner, tokenizer, [act(c) for c in steps], game, PROMPT)
        assert trajectory.reward == 1.0 and trajectory.extra_logs["turns"] == len(steps)


def test_missing_data_fails_with_the_fix(monkeypatch, tmp_path):
    monkeypatch.delenv("ALFWORLD_DATA", raising=False)
    with pytest.raises(AlfWorldDataError, match="ALFWORLD_DATA is not set.*alfworld-download"):
        resolve_game_file(TRAIN_GAME)
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path))
    with pytest.raises(AlfWorldDataError, match="does not exist: check ALFWORLD_DATA"):
        resolve_game_file(TRAIN_GAME)
    with pytest.raises(AlfWorldDataError, match="not a game file path"):
        resolve_game_file({"ground_truth": "x"})
    absolute = str(DATA / TRAIN_GAME)
    assert resolve_game_file(absolute) == absolute


def test_prompt_without_the_observation_slot_is_refused(runner, tokenizer):
    with pytest.raises(ValueError, match="lacks the .*alfworld_observation.* slot"):
        harness.run_episode(runner, tokenizer, [act("look")], TRAIN_GAME, harness.chat_prompt(None, "Play."))


def test_action_parsing_and_hints():
    assert parse_action("x <action>Go  To Fridge 1</action> y <action>look</action>") == "look"
    assert parse_action("<action>\n  take apple 1 from countertop 1 \n</action>") == "take apple 1 from countertop 1"
    assert parse_action("go to fridge 1") is None and parse_action("<action> </action>") is None
    hints = describe("-= Welcome to TextWorld, ALFRED! =-\n\nRoom.", ["help", *[f"go to shelf {i}" for i in range(40)]])
    assert hints.startswith("Room.\n\nAdmissible actions: go to shelf 0, ")
    assert hints.count("go to shelf") == 30 and "help" not in hints


def test_closed_games_hand_their_planner_copy_to_the_next_game():
    """TextWorld loads a 33 MB planner copy per game and unloading one crashes the process at exit,
    so a closed game's copy is reused: sequential games share one copy, concurrent games never do."""
    pytest.importorskip("alfworld", reason="pip install 'molt-flashreinforce[alfworld]'")
    from molt_flashreinforce.agents.alfworld_game import AlfWorldGame

    path = str(DATA / TRAIN_GAME)
    first, second = AlfWorldGame(path), AlfWorldGame(path)
    first_planner, second_planner = first._env.unwrapped.downward_lib, second._env.unwrapped.downward_lib
    assert first_planner is not second_planner  # open at the same time: private copies
    first.reset()
    first.close()
    third = AlfWorldGame(path)
    assert third._env.unwrapped.downward_lib is first_planner
    third.reset()
    for command in SOLUTION:  # the recycled copy plays a whole game correctly
        step = third.step(command)
    assert step.won and step.done
    second.close()
    third.close()


def test_games_started_concurrently_from_threads_all_load_and_play():
    """Molt's runner plays many games at once on its event loop's threads; TextWorld's module-level
    PDDL parser is not thread-safe (found by the CPU rehearsal: every concurrent load but one
    failed inside tatsu), so loading and stepping are serialised."""
    pytest.importorskip("alfworld", reason="pip install 'molt-flashreinforce[alfworld]'")
    from concurrent.futures import ThreadPoolExecutor

    from molt_flashreinforce.agents.alfworld_game import AlfWorldGame

    def play(_):
        game = AlfWorldGame(str(DATA / TRAIN_GAME))
        try:
            game.reset()
            return [game.step(command) for command in SOLUTION][-1].won
        finally:
            game.close()

    with ThreadPoolExecutor(max_workers=6) as pool:
        assert list(pool.map(play, range(6))) == [True] * 6
