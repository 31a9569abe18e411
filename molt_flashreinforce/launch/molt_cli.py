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
exceptions (ValueError, AssertionError, NotImplementedError) with Molt's messages.
"""

from __future__ import annotations

import argparse
import ast
import functools
import inspect
from types import CodeType, SimpleNamespace


class MoltArgumentError(ValueError):
    """Molt's argparse parser refused the command line."""


@functools.lru_cache(maxsize=1)
def _lifted_block() -> tuple[CodeType, CodeType, dict]:
    import molt.cli.train_rl_ray as train_rl_ray

    path = inspect.getsourcefile(train_rl_ray)
    tree = ast.parse(open(path, encoding="utf-8").read(), filename=path)
    main_block = next(
        node
        for node in tree.body
        if isinstance(node, ast.If) and ast.unparse(node.test) == "__name__ == '__main__'"
    )
    body = main_block.body
    split = next(
        i for i, stmt in enumerate(body) if ast.unparse(stmt).replace(" ", "") == "args=parser.parse_args()"
    )
    if ast.unparse(body[-1]) != "train(args)":
        raise RuntimeError(
            f"{path} no longer ends its __main__ block with train(args); this Molt version is not supported."
        )

    def compile_statements(statements: list[ast.stmt]) -> CodeType:
        return compile(ast.Module(body=statements, type_ignores=[]), path, "exec")

    return compile_statements(body[:split]), compile_statements(body[split + 1 : -1]), vars(train_rl_ray)


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
    # neighbours, resolve_ckpt_retention), so they run in a namespace where those ran.
    namespace = _run_build_statements()
    namespace["args"] = (parser or namespace["parser"]).parse_args(argv)
    exec(validate_code, namespace)
    return namespace["args"]
