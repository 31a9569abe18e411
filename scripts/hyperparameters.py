"""Every hyperparameter of every paper experiment x algo, with its source, generated from the configs.

`python scripts/hyperparameters.py > docs/hyperparameters.md` writes the tables (the algorithms'
settings, then every experiment's values);
a test regenerates it and diffs it, so it cannot drift from `molt_flashreinforce/conf/`.

For each paper experiment (`conf.paper_experiments()`) x algo the config is composed with Hydra, and each hyperparameter (`algo.*`,
`molt.*`, the model, the agent's turn settings, the seed, the placement) is traced to the last
config file of the defaults list that sets it. That file's comment on the key (inline, or when
there is none the comment lines right above it) gives its source tags (docs/sources.md) and its origin:
"our choice" when the comment says so, "paper (secondary)" when every tag is a third party's
reading, "paper" otherwise; tags inside parentheses name other values' sources and are skipped
when the comment has tags outside them. A value with neither is listed as "unsourced" (a test keeps that
list empty).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import PurePosixPath

from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from molt_flashreinforce import conf
from molt_flashreinforce.algo_settings import ALGORITHMS, SETTINGS

EXPERIMENTS = tuple(conf.paper_experiments())
ALGOS = ALGORITHMS
SECONDARY_TAGS = {"P3", "P3t", "P3m"}
# Keys outside `algo` and `molt` that are hyperparameters of the run (paths and logging are not).
RUN_KEYS = ("seed", "model.name_or_path", "model.max_position_embeddings", "agent.kind", "agent.max_turns",
            "agent.enable_thinking")
_TAG = re.compile(r"\[([A-Z][A-Za-z0-9]*(?::[a-z0-9_]+)?)(?: [^\]]*)?\]")
_PARENTHESIS = re.compile(r"\([^()]*\)")
_KEY_LINE = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z_][A-Za-z0-9_]*):(?P<rest>.*)$")


@dataclass(frozen=True)
class Annotated:
    comment: str  # the inline comment, or the comment lines right above when there is none


def _annotations(text: str, package: str) -> dict[str, Annotated]:
    """dotted key -> its comment, for a block-style YAML config file (`package` prefixes its keys)."""
    out: dict[str, Annotated] = {}
    stack: list[tuple[int, str]] = []
    above: list[str] = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            above.append(stripped.lstrip("#").strip())
            continue
        match = _KEY_LINE.match(line)
        if not match or stripped.startswith("- "):
            above = []
            continue
        indent = len(match["indent"])
        while stack and stack[-1][0] >= indent:
            stack.pop()
        key = ".".join([*(name for _, name in stack), match["key"]])
        rest = match["rest"]
        value, _, inline = rest.partition(" #")
        if value.strip():
            dotted = f"{package}.{key}" if package else key
            out[dotted] = Annotated(inline.strip() or " ".join(above))
        else:
            stack.append((indent, match["key"]))
        above = []
    return out


def _read(group_path: str) -> str:
    return (resources.files("molt_flashreinforce.conf") / group_path).read_text(encoding="utf-8")


def _defaults_comment(experiment_text: str, group: str) -> str | None:
    for line in experiment_text.splitlines():
        if f"override /{group}:" in line:
            return line.partition(" #")[2].strip()
    return None


@dataclass(frozen=True)
class Entry:
    key: str
    value: str
    tags: tuple[str, ...]
    origin: str
    file: str


def _origin(comment: str) -> tuple[tuple[str, ...], str]:
    # A parenthesis names other values' sources ("(native: 350 passes [J:r1])"), not this one's.
    tags = tuple(dict.fromkeys(_TAG.findall(_PARENTHESIS.sub("", comment)) or _TAG.findall(comment)))
    if "our choice" in comment.lower():
        return tags, "our choice"
    if not tags:
        return tags, "unsourced"
    return tags, "paper (secondary)" if set(tags) <= SECONDARY_TAGS else "paper"


def _format(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null (unset)"
    if isinstance(value, list):
        return "[" + ", ".join(_format(v) for v in value) + "]"
    return str(value)


def _leaves(node, prefix: str):
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _leaves(value, f"{prefix}.{key}")
    else:
        yield prefix, node


@functools.lru_cache(maxsize=None)
def entries(experiment: str, algo: str) -> tuple[Entry, ...]:
    with initialize_config_module(config_module="molt_flashreinforce.conf", version_base="1.3"):
        cfg = compose(config_name="config", overrides=[f"experiment={experiment}", f"algo={algo}"])
    resolved = OmegaConf.to_container(cfg, resolve=True)
    experiment_file = f"experiment/{experiment}.yaml"
    files = [("config.yaml", ""), (f"algo/{algo}.yaml", "algo"), (experiment_file, ""),
             (f"experiment_algo/{experiment}_{algo}.yaml", "")]
    layers = []
    for path, package in files:
        if (resources.files("molt_flashreinforce.conf") / path).is_file():
            layers.append((path, _annotations(_read(path), package)))

    keys = [key for key in RUN_KEYS] + [key for key, _ in _leaves(resolved["algo"], "algo")]
    keys += [key for key, _ in _leaves(resolved["molt"], "molt")]
    out = []
    for key in keys:
        value = OmegaConf.select(cfg, key)
        owner = next(((path, notes[key]) for path, notes in reversed(layers) if key in notes), None)
        # Nulls are listed only where an experiment file sets them on purpose.
        if owner is None or key == "algo.name" or (value is None and not owner[0].startswith("experiment")):
            continue
        tags, origin = _origin(owner[1].comment)
        out.append(Entry(key, _format(value), tags, origin, owner[0]))

    placement = _placement_choice(experiment)
    comment = _defaults_comment(_read(experiment_file), "placement")
    where = experiment_file
    if comment is None:
        comment = " ".join(line.lstrip("#").strip() for line in _read(f"placement/{placement}.yaml").splitlines()
                           if line.startswith("#"))
        where = f"placement/{placement}.yaml"
    tags, origin = _origin(comment)
    out.append(Entry("placement", placement, tags, origin, where))
    return tuple(out)


def _placement_choice(experiment: str) -> str:
    for line in _read(f"experiment/{experiment}.yaml").splitlines():
        if "override /placement:" in line:
            return line.split(":", 1)[1].partition("#")[0].strip()
    return "gpu8_actor1_vllm7"


def _range(setting) -> str:
    if setting.choices:
        return " \\| ".join(setting.choices)
    if setting.exactly is not None:
        return f"= {setting.exactly}"
    if setting.low is None and setting.high is None:
        return "true \\| false" if setting.type is bool else "—"
    left, right = ("(", ")") if setting.open_range else ("[", "]")
    high = "inf" if setting.high is None else f"{setting.high:g}"
    return f"{left}{setting.low:g}, {high}{right}" if setting.high is not None or setting.type is float else f">= {setting.low}"


def settings_table() -> list[str]:
    """Every `algo.*` setting of `molt_flashreinforce/algo_settings.py`, one table per algorithm."""
    lines = []
    for algorithm in ALGORITHMS:
        lines += [f"### algo={algorithm}", "", "| key | type | values | default | source | what it does |",
                  "|---|---|---|---|---|---|"]
        for setting in SETTINGS[algorithm]:
            kind = setting.type.__name__ + (" or null" if setting.optional else "")
            help_text = setting.help.replace("|", "\\|")
            lines.append(f"| `algo.{setting.name}` | {kind} | {_range(setting)} | `{setting.yaml_value()}` | "
                         f"{setting.source or '—'} | {help_text or '—'} |")
        lines.append("")
    return lines


def render() -> str:
    lines = [
        "# Hyperparameters of the paper experiments",
        "",
        "Generated from `molt_flashreinforce/conf/` by",
        "`python scripts/hyperparameters.py > docs/hyperparameters.md`; do not edit",
        "(tests/test_hyperparameters.py regenerates it and fails on any difference).",
        "",
        "Every value each experiment x algo sets, as Molt gets it (`molt.*` are Molt's own flags;",
        "`algo.*` renders Molt's recipe flags and `--flashreinforce.*`). *source* lists the tags of",
        "[sources.md](sources.md) the config cites for it; *origin* says whether the paper (its",
        "authors' files, or only a third party's reading: secondary) gives the value, or it is our",
        "choice; *set in* is the config file that decides it. Molt defaults for flags not listed",
        "apply unchanged.",
        "",
        "## The algorithms' settings",
        "",
        "Each `algo.*` key, as `molt_flashreinforce/algo_settings.py` declares it (it also generates",
        "`conf/algo/*.yaml`, the `--flashreinforce.*` flags and the launcher's checks of these keys).",
        "",
        *settings_table(),
    ]
    for experiment in EXPERIMENTS:
        for algo in ALGOS:
            lines += [f"## {experiment}, algo={algo}", "", "| hyperparameter | value | source | origin | set in |",
                      "|---|---|---|---|---|"]
            for entry in entries(experiment, algo):
                source = ", ".join(f"[{tag}]" for tag in entry.tags) or "—"
                file = PurePosixPath(entry.file).as_posix()
                lines.append(f"| `{entry.key}` | `{entry.value}` | {source} | {entry.origin} | `{file}` |")
            lines.append("")
    return "\n".join(lines)


def main() -> None:
    print(render(), end="")


if __name__ == "__main__":
    main()
