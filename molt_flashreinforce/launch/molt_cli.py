"""Molt's own `train_rl_ray` command line, reused statement for statement.

Molt builds its parser and validates the arguments inline under `if __name__ == "__main__":`
in `molt/cli/train_rl_ray.py`, so nothing there is importable. This module lifts that block out
of the installed source with `ast` and runs its statements unchanged, in the module's own
namespace, in two halves:

* `build_parser()`: every statement before `args = parser.parse_args()`, then our two additions
  (`extend_choices` so Molt's `choices` accept `flashreinforce`, and the `--flashreinforce.*` flags).
* `parse_and_validate(argv)`: `parse_args(argv)`, then every statement after it up to the final
  `train(args)` (Molt's hierarchize, derived defaults and checks), which is not run. Returns the
  nested `args` exactly as Molt's `train(args)` would receive them.

Argparse errors raise `MoltArgumentError` instead of exiting, and Molt's own checks raise their own
exceptions (ValueError, AssertionError, NotImplementedError) with Molt's messages. A Molt whose
block is laid out otherwise is refused by plugin/seams.py (`MoltDrift`, one line).
"""

from __future__ import annotations

import argparse
import ast
import functools
from types import CodeType, SimpleNamespace


class MoltArgumentError(ValueError):
    """Molt's argparse parser refused the command line."""


@functools.lru_cache(maxsize=1)
def _lifted_block() -> tuple[CodeType, CodeType, dict]:
    from molt_flashreinforce.plugin.seams import train_rl_ray_main_block

    body, path, module_globals = train_rl_ray_main_block()  # its layout is checked there
    split = next(i for i, stmt in enumerate(body) if ast.unparse(stmt).replace(" ", "") == "args=parser.parse_args()")

    def compile_statements(statements: list[ast.stmt]) -> CodeType:
        return compile(ast.Module(body=statements, type_ignores=[]), path, "exec")

    return compile_statements(body[:split]), compile_statements(body[split + 1 : -1]), module_globals


def _raise_instead_of_exit(message: str) -> None:
    raise MoltArgumentError(message)


def _run_build_statements() -> dict:
    """A fresh copy of the module namespace after Molt's parser-building statements ran in it."""
    from molt_flashreinforce.plugin.cli_flags import add_plugin_arguments, extend_choices

    build_code, _, module_globals = _lifted_block()
    namespace = dict(module_globals)
    exec(build_code, namespace)
    parser = namespace["parser"]
    extend_choices(parser)
    add_plugin_arguments(parser)
    parser.error = _raise_instead_of_exit
    parser.molt_namespace = namespace  # parse_and_validate runs Molt's checks in it
    return namespace


def build_parser() -> argparse.ArgumentParser:
    """Molt's `train_rl_ray` parser with `flashreinforce` accepted and our flags added."""
    return _run_build_statements()["parser"]


def flag_dests(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """Every dotted destination the parser accepts, mapped to its action."""
    return {action.dest: action for action in parser._actions if action.dest != "help"}


def parse_and_validate(argv: list[str], parser: argparse.ArgumentParser | None = None) -> SimpleNamespace:
    """Parse `argv` and run Molt's own derivation and validation; return the nested args."""
    _, validate_code, _ = _lifted_block()
    # The validation statements use names the building statements imported (hierarchize's
    # neighbours, resolve_ckpt_retention), so they run in the namespace where those ran.
    namespace = dict((parser or build_parser()).molt_namespace)
    namespace["args"] = namespace["parser"].parse_args(argv)
    exec(validate_code, namespace)
    return namespace["args"]
