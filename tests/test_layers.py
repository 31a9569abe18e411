"""No import in the package runs upward: every `molt_flashreinforce` import, lazy ones inside
functions included, goes to a lower layer or stays inside its own package.

The layers, bottom first (README, "Layout"): the facts every part shares (the algorithms'
settings, tag names, the CPU task's split, model cards, the config tree); the algorithm; what
spans machines and the agent files; the Molt integration; the two backends' own parts and data
preparation; the launcher; the report and the eval command; the rehearsal; the command line at the
top.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "molt_flashreinforce"
LAYERS = (
    ("algo_settings", "metrics", "eval_record", "addition_split", "modelcards", "conf"),
    ("objective", "entropy", "fused_head"),
    ("cluster", "agents"),
    ("plugin",),
    ("local", "data"),
    ("launch",),
    ("report", "evaluation"),
    ("rehearsal",),
    ("app",),
    ("__main__", ""),  # "": the package's own __init__ (molt_flashreinforce.register)
)
RANK = {part: rank for rank, parts in enumerate(LAYERS) for part in parts}


def part_of(path: Path) -> str:
    """The top-level part a source file belongs to ("" for the package's __init__)."""
    relative = path.relative_to(PACKAGE)
    return "" if relative == Path("__init__.py") else relative.parts[0].removesuffix(".py")


def imported_parts(tree: ast.AST):
    """(line, part) for every import of the package in `tree`."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] if node.module != "molt_flashreinforce" else \
                [f"molt_flashreinforce.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            head, _, rest = name.partition(".")
            if head == "molt_flashreinforce":
                part = rest.partition(".")[0]
                yield node.lineno, part if (PACKAGE / part).is_dir() or (PACKAGE / f"{part}.py").is_file() else ""


def violations(source: str, tree: ast.AST, where: str) -> list[str]:
    """The imports of `tree`, a module of part `source`, that do not run downward."""
    found = []
    for line, target in imported_parts(tree):
        if target not in RANK:
            found.append(f"{where}:{line} imports {target!r}, which is in no layer of tests/test_layers.py")
        elif target != source and RANK[target] >= RANK[source]:
            found.append(f"{where}:{line}: {source or 'the package'} (layer {RANK[source]}) imports "
                         f"{target or 'the package'} (layer {RANK[target]})")
    return found


def test_no_import_runs_upward():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        where, source = str(path.relative_to(PACKAGE.parent)), part_of(path)
        if source not in RANK:
            found.append(f"{where}: {source!r} is in no layer of tests/test_layers.py")
        else:
            found += violations(source, ast.parse(path.read_text(encoding="utf-8")), where)
    assert found == []


def test_the_check_sees_lazy_upward_and_sideways_imports():
    tree = ast.parse("from molt_flashreinforce import metrics, __version__\nimport molt_flashreinforce.data.cli\n"
                     "def f():\n    from molt_flashreinforce.rehearsal.run import layout\n")
    assert sorted(imported_parts(tree)) == [(1, ""), (1, "metrics"), (2, "data"), (4, "rehearsal")]
    local = RANK["local"]
    assert violations("local", tree, "x.py") == [
        f"x.py:1: local (layer {local}) imports the package (layer {RANK['']})",
        f"x.py:2: local (layer {local}) imports data (layer {local})",
        f"x.py:4: local (layer {local}) imports rehearsal (layer {RANK['rehearsal']})"]
    assert violations("app", ast.parse("from molt_flashreinforce.rehearsal import run"), "x.py") == []
