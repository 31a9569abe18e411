"""The paper's reported numbers: load and validate `paper_results.yaml`.

Contract: `load_paper_results(path=None)` returns a `PaperResults` whose every experiment,
metric, table row, layout, arm and reported number has been checked (types, cross references,
source tags, metric tag names from `molt_flashreinforce.metrics`). Eval datasources are the data
recipe's (`data.recipes.eval_datasources`): an experiment's `datasets` are read from its recipe,
`eval_pass1: all` means all of them, and a name the recipe does not write is refused, so the
report can never look for a tag the data command's rows do not produce. Any malformed entry
raises `PaperResultsError` naming the file, the entry's location and how to fix it. Nothing here
reads runs; see `protocol.py` for how a run is measured against these definitions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from molt_flashreinforce import metrics as metric_names
from molt_flashreinforce.data.recipes import RECIPES, eval_datasources
from molt_flashreinforce.eval_record import GRADERS

DEFAULT_PATH = Path(__file__).with_name("paper_results.yaml")
SCHEMA_VERSION = 1
SOURCE_KINDS = ("primary", "secondary")
SELECTORS = ("step", "rollouts", "peak", "mean")
PLOT_AXES = ("step", "rollouts")
ALL_DATASOURCES = "all"
RECIPES_MODULE = "molt_flashreinforce/data/recipes.py"


class PaperResultsError(ValueError):
    """A malformed paper-results file."""


@dataclass(frozen=True)
class Source:
    tag: str
    kind: str  # primary: the paper's authors; secondary: a third party's reading of the PDF
    what: str
    where: str


@dataclass(frozen=True)
class TagSet:
    """Tags averaged step by step; `complement` turns the mean m into 1 - m."""

    tags: tuple[str, ...]
    complement: bool = False


@dataclass(frozen=True)
class Metric:
    id: str
    label: str
    unit: str
    scale: float
    decimals: int
    alternatives: tuple[TagSet, ...]  # the first one whose tags a run has is used
    column: str = ""  # the short heading of the paper-layout table
    datasources: tuple[str, ...] = ()  # an eval metric's datasources (mean of their eval_pass1)


@dataclass(frozen=True)
class At:
    """Where in a run a value is read.

    step: the last value at or before step `bound` (inf = the final value).
    rollouts: the last value at or before the step where `train/rollouts_consumed` reaches `bound`.
    peak: the best value at or before step `bound`.
    mean: the mean of all values at or before step `bound`.
    """

    selector: str
    bound: float

    def describe(self) -> str:
        bound = "end" if math.isinf(self.bound) else f"{self.bound:,.0f}"
        if self.selector == "step":
            return "final" if math.isinf(self.bound) else f"step {bound}"
        if self.selector == "rollouts":
            return f"{bound} rollouts"
        if self.selector == "peak":
            return "best eval" if math.isinf(self.bound) else f"best eval to step {bound}"
        return "run mean" if math.isinf(self.bound) else f"mean to step {bound}"


@dataclass(frozen=True)
class Layout:
    """The paper's table: `columns` (metric ids) at each of `points`; `target`: a row id or None."""

    columns: tuple[str, ...]
    points: tuple[At, ...]
    target: str | None


@dataclass(frozen=True)
class Row:
    id: str
    metric: str
    at: At


@dataclass(frozen=True)
class Arm:
    id: str
    label: str
    when: dict[str, Any] | None  # None: no config of this package reproduces the arm


@dataclass(frozen=True)
class Reported:
    value: float | None
    sources: tuple[str, ...]
    arm: str | None = None
    row: str | None = None  # a table row value
    metric: str | None = None  # with `step`: a curve point shown on plots only
    step: float | None = None  # where the paper measured it, when it differs from the row's step
    what: str | None = None  # a fact no single run measures
    unit: str | None = None
    note: str | None = None


@dataclass(frozen=True)
class Experiment:
    name: str
    title: str
    model: str
    protocol: dict[str, Any]
    arms: dict[str, Arm]
    default_arm: str
    metrics: dict[str, Metric]
    rows: tuple[Row, ...]
    plot_x: str
    plot_metrics: tuple[str, ...]
    reported: tuple[Reported, ...]
    datasets: tuple[str, ...] = ()  # the data recipe's eval datasources
    layout: Layout | None = None


@dataclass(frozen=True)
class PaperResults:
    path: Path
    sources: dict[str, Source]
    experiments: dict[str, Experiment]
    unattributed: tuple[Reported, ...]

    def experiment(self, name: str) -> Experiment:
        if name not in self.experiments:
            known = ", ".join(sorted(self.experiments))
            raise PaperResultsError(f"unknown experiment {name!r}; known experiments: {known}")
        return self.experiments[name]

    def is_secondary(self, entry: Reported) -> bool:
        """True when no source of the entry is the paper's authors."""
        return all(self.sources[tag].kind == "secondary" for tag in entry.sources)


def load_paper_results(path: str | Path | None = None) -> PaperResults:
    path = Path(path) if path is not None else DEFAULT_PATH
    try:
        # libyaml's loader when PyYAML has it: the same YAML 1.1 rules, ten times faster than the pure-Python one.
        raw = yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except FileNotFoundError:
        raise PaperResultsError(f"paper results file {path} does not exist") from None
    except yaml.YAMLError as err:
        raise PaperResultsError(f"{path} is not valid YAML: {err}") from None
    return _Parser(path).parse(raw)


class _Parser:
    """Walks the YAML tree; `where` strings name each entry in error messages."""

    def __init__(self, path: Path):
        self.path = path

    def fail(self, where: str, problem: str) -> PaperResultsError:
        return PaperResultsError(f"{self.path}: {where}: {problem}")

    def mapping(self, value: Any, where: str, required: tuple[str, ...], optional: tuple[str, ...] = ()) -> dict:
        if not isinstance(value, dict):
            raise self.fail(where, f"expected a mapping, got {type(value).__name__}")
        missing = [key for key in required if key not in value]
        if missing:
            raise self.fail(where, f"missing key(s) {', '.join(missing)}")
        unknown = sorted(set(value) - set(required) - set(optional))
        if unknown:
            allowed = ", ".join(required + optional)
            raise self.fail(where, f"unknown key(s) {', '.join(map(str, unknown))}; allowed: {allowed}")
        return value

    def keyed(self, value: Any, where: str) -> dict:
        """A mapping whose keys are names chosen by the file (experiments, arms, ...)."""
        if not isinstance(value, dict):
            raise self.fail(where, f"expected a mapping, got {type(value).__name__}")
        return value

    def text(self, value: Any, where: str) -> str:
        if not isinstance(value, str) or not value.strip():
            raise self.fail(where, "expected a non-empty string")
        return value

    def number(self, value: Any, where: str, allow_none: bool = False) -> float | None:
        if value is None and allow_none:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
            hint = " (write floats with a dot, e.g. 1.0e-3: YAML reads 1e-3 as a string)" if isinstance(value, str) else ""
            raise self.fail(where, f"expected a number, got {value!r}{hint}")
        return float(value)

    def parse(self, raw: Any) -> PaperResults:
        top = self.mapping(raw, "top level", ("schema_version", "sources", "experiments"), ("unattributed",))
        if top["schema_version"] != SCHEMA_VERSION:
            raise self.fail("schema_version", f"expected {SCHEMA_VERSION}, got {top['schema_version']!r}")
        sources = self.sources(top["sources"])
        experiments_raw = self.keyed(top["experiments"], "experiments")
        experiments = {
            name: self.experiment(name, body, sources) for name, body in experiments_raw.items()
        }
        unattributed_raw = top.get("unattributed") or []
        if not isinstance(unattributed_raw, list):
            raise self.fail("unattributed", "expected a list")
        unattributed = tuple(
            self.reported(entry, f"unattributed[{i}]", sources, arms={}, metrics={}, rows={})
            for i, entry in enumerate(unattributed_raw)
        )
        for i, entry in enumerate(unattributed):
            if entry.what is None:
                raise self.fail(f"unattributed[{i}]", "needs `what` (these entries are facts, not table values)")
        return PaperResults(self.path, sources, experiments, unattributed)

    def sources(self, raw: Any) -> dict[str, Source]:
        sources = {}
        for tag, body in self.keyed(raw, "sources").items():
            where = f"sources.{tag}"
            body = self.mapping(body, where, ("kind", "what", "where"))
            if body["kind"] not in SOURCE_KINDS:
                raise self.fail(where, f"kind must be one of {', '.join(SOURCE_KINDS)}, got {body['kind']!r}")
            sources[tag] = Source(tag, body["kind"], self.text(body["what"], where), self.text(body["where"], where))
        if not sources:
            raise self.fail("sources", "no sources defined")
        return sources

    def experiment(self, name: str, raw: Any, sources: dict[str, Source]) -> Experiment:
        where = f"experiments.{name}"
        body = self.mapping(
            raw, where, ("title", "model", "protocol", "arms", "default_arm", "metrics", "rows", "plot", "reported"),
            ("layout",)
        )
        protocol = self.mapping(body["protocol"], f"{where}.protocol", ("summary",), (
            "avg_at_k", "temperature", "top_p", "max_tokens", "grader", "grader_note", "eval_every", "horizon_steps",
            "batch", "max_turns"))
        self.text(protocol["summary"], f"{where}.protocol.summary")
        for key in ("avg_at_k", "max_tokens"):
            count = protocol.get(key)
            if count is not None and (not isinstance(count, int) or count < 1):
                raise self.fail(f"{where}.protocol.{key}", f"expected a positive integer or null, got {count!r}")
        if protocol.get("grader") is not None and protocol["grader"] not in GRADERS:
            raise self.fail(f"{where}.protocol.grader",
                            f"{protocol['grader']!r} is not a grader of eval_record.GRADERS: {', '.join(GRADERS)}")
        datasets = eval_datasources(name) if name in RECIPES else ()

        arms = {arm_id: self.arm(arm_id, arm, f"{where}.arms.{arm_id}")
                for arm_id, arm in self.keyed(body["arms"], f"{where}.arms").items()}
        if body["default_arm"] not in arms:
            raise self.fail(f"{where}.default_arm", f"{body['default_arm']!r} is not one of the arms {', '.join(arms)}")
        metrics = {metric_id: self.metric(metric_id, metric, f"{where}.metrics.{metric_id}", name, datasets)
                   for metric_id, metric in self.keyed(body["metrics"], f"{where}.metrics").items()}
        rows = self.rows(body["rows"], f"{where}.rows", metrics)
        plot = self.mapping(body["plot"], f"{where}.plot", ("x", "metrics"))
        if plot["x"] not in PLOT_AXES:
            raise self.fail(f"{where}.plot.x", f"must be one of {', '.join(PLOT_AXES)}, got {plot['x']!r}")
        if not isinstance(plot["metrics"], list) or not plot["metrics"]:
            raise self.fail(f"{where}.plot.metrics", "expected a non-empty list of metric ids")
        for metric_id in plot["metrics"]:
            if metric_id not in metrics:
                raise self.fail(f"{where}.plot.metrics", f"unknown metric {metric_id!r}")
        if not isinstance(body["reported"], list):
            raise self.fail(f"{where}.reported", "expected a list")
        rows_by_id = {row.id: row for row in rows}
        reported = tuple(
            self.reported(entry, f"{where}.reported[{i}]", sources, arms, metrics, rows_by_id)
            for i, entry in enumerate(body["reported"])
        )
        layout = self.layout(body["layout"], f"{where}.layout", metrics, rows_by_id) if "layout" in body else None
        return Experiment(
            name=name, title=self.text(body["title"], f"{where}.title"), model=self.text(body["model"], f"{where}.model"),
            protocol=protocol, arms=arms, default_arm=body["default_arm"], metrics=metrics, rows=rows,
            plot_x=plot["x"], plot_metrics=tuple(plot["metrics"]), reported=reported, datasets=datasets, layout=layout,
        )

    def layout(self, raw: Any, where: str, metrics: dict[str, Metric], rows: dict[str, Row]) -> Layout:
        body = self.mapping(raw, where, ("columns", "points"), ("target",))
        columns = body["columns"]
        if not isinstance(columns, list) or not columns:
            raise self.fail(f"{where}.columns", "expected a non-empty list of metric ids")
        for metric_id in columns:
            if metric_id not in metrics:
                raise self.fail(f"{where}.columns", f"unknown metric {metric_id!r}; defined: {', '.join(metrics)}")
        points = body["points"]
        if not isinstance(points, list) or not points:
            raise self.fail(f"{where}.points", "expected a non-empty list of protocol points ({step: N}, ...)")
        target = body.get("target")
        if target is not None and target not in rows:
            raise self.fail(f"{where}.target", f"unknown row {target!r}; defined: {', '.join(rows)}")
        return Layout(tuple(columns), tuple(self.at(point, f"{where}.points[{i}]") for i, point in enumerate(points)),
                      target)

    def arm(self, arm_id: str, raw: Any, where: str) -> Arm:
        body = self.mapping(raw, where, ("label", "when"))
        when = body["when"]
        if when is not None:
            when = self.keyed(when, f"{where}.when")
            if not when:
                raise self.fail(f"{where}.when", "empty: give config keys (e.g. algo.name) or null for no config")
        return Arm(arm_id, self.text(body["label"], where), when)

    def metric(self, metric_id: str, raw: Any, where: str, experiment: str, recipe: tuple[str, ...]) -> Metric:
        body = self.mapping(raw, where, ("label", "unit"),
                            ("eval_pass1", "tag", "else_one_minus", "scale", "decimals", "column"))
        if ("eval_pass1" in body) == ("tag" in body):
            raise self.fail(where, "give exactly one of `eval_pass1` (datasource names) or `tag` (a metrics.py name)")
        datasets: tuple[str, ...] = ()
        if "eval_pass1" in body:
            datasets = self.datasources(body["eval_pass1"], f"{where}.eval_pass1", experiment, recipe)
            alternatives = [TagSet(tuple(metric_names.eval_pass1(d) for d in datasets))]
        else:
            alternatives = [TagSet((self.tag_name(body["tag"], f"{where}.tag"),))]
        if "else_one_minus" in body:
            alternatives.append(TagSet((self.tag_name(body["else_one_minus"], f"{where}.else_one_minus"),), True))
        decimals = body.get("decimals", 1)
        if not isinstance(decimals, int) or decimals < 0:
            raise self.fail(f"{where}.decimals", f"expected a non-negative integer, got {decimals!r}")
        scale = self.number(body.get("scale", 1), f"{where}.scale")
        label = self.text(body["label"], where)
        column = self.text(body["column"], f"{where}.column") if "column" in body else label
        return Metric(metric_id, label, self.text(body["unit"], f"{where}.unit"), scale, decimals, tuple(alternatives),
                      column, datasets)

    def datasources(self, raw: Any, where: str, experiment: str, recipe: tuple[str, ...]) -> tuple[str, ...]:
        """`all` or a list of names, each an eval datasource of the experiment's data recipe."""
        if raw == ALL_DATASOURCES:
            if not recipe:
                raise self.fail(where, f"`all` needs a data recipe, and {RECIPES_MODULE} has none for {experiment!r}")
            return recipe
        if not isinstance(raw, list) or not raw or not all(isinstance(d, str) and d for d in raw):
            raise self.fail(where, f"expected `{ALL_DATASOURCES}` or a non-empty list of datasource names")
        unknown = [name for name in raw if recipe and name not in recipe]
        if unknown:
            raise self.fail(where, f"{', '.join(map(repr, unknown))} is not an eval datasource of {experiment}'s data "
                                   f"recipe ({RECIPES_MODULE}), which writes {', '.join(recipe)}; use those names")
        return tuple(raw)

    def tag_name(self, name: Any, where: str) -> str:
        tag = getattr(metric_names, name, None) if isinstance(name, str) and name.isupper() else None
        if not isinstance(tag, str):
            raise self.fail(where, f"{name!r} is not a tag constant of molt_flashreinforce.metrics (e.g. TOOL_CALLS)")
        return tag

    def rows(self, raw: Any, where: str, metrics: dict[str, Metric]) -> tuple[Row, ...]:
        if not isinstance(raw, list) or not raw:
            raise self.fail(where, "expected a non-empty list of rows")
        rows, seen = [], set()
        for i, entry in enumerate(raw):
            row_where = f"{where}[{i}]"
            body = self.mapping(entry, row_where, ("id", "metric", "at"))
            if body["id"] in seen:
                raise self.fail(row_where, f"duplicate row id {body['id']!r}")
            seen.add(body["id"])
            if body["metric"] not in metrics:
                raise self.fail(row_where, f"unknown metric {body['metric']!r}; defined: {', '.join(metrics)}")
            rows.append(Row(body["id"], body["metric"], self.at(body["at"], f"{row_where}.at")))
        return tuple(rows)

    def at(self, raw: Any, where: str) -> At:
        if not isinstance(raw, dict) or len(raw) != 1 or next(iter(raw)) not in SELECTORS:
            raise self.fail(where, f"expected one of {{{': N}, {'.join(SELECTORS)}: N}} (N may be .inf), got {raw!r}")
        selector, bound = next(iter(raw.items()))
        bound = self.number(bound, f"{where}.{selector}")
        if bound < 0:
            raise self.fail(f"{where}.{selector}", f"must be >= 0, got {bound}")
        return At(selector, bound)

    def reported(self, raw: Any, where: str, sources: dict[str, Source], arms: dict[str, Arm],
                 metrics: dict[str, Metric], rows: dict[str, Row]) -> Reported:
        body = self.mapping(raw, where, ("value", "sources"), ("arm", "row", "metric", "step", "what", "unit", "note"))
        kinds = [key for key in ("row", "metric", "what") if key in body]
        if len(kinds) != 1:
            raise self.fail(where, "give exactly one of `row` (table value), `metric` + `step` (curve point) or `what` (fact)")
        tags = body["sources"]
        if not isinstance(tags, list) or not tags:
            raise self.fail(f"{where}.sources", "expected a non-empty list of source tags")
        for tag in tags:
            if tag not in sources:
                raise self.fail(f"{where}.sources", f"unknown source tag {tag!r}; known: {', '.join(sources)}")
        arm = body.get("arm")
        if arm is not None and arm not in arms:
            known = ", ".join(arms) or "none (unattributed entries have no arms)"
            raise self.fail(f"{where}.arm", f"unknown arm {arm!r}; known: {known}")
        value = self.number(body["value"], f"{where}.value", allow_none="what" in body)
        step = self.number(body["step"], f"{where}.step") if "step" in body else None
        if "row" in body:
            if body["row"] not in rows:
                raise self.fail(f"{where}.row", f"unknown row {body['row']!r}; defined: {', '.join(rows)}")
            if arm is None:
                raise self.fail(where, "a table value needs an `arm`")
        if "metric" in body:
            if body["metric"] not in metrics:
                raise self.fail(f"{where}.metric", f"unknown metric {body['metric']!r}; defined: {', '.join(metrics)}")
            if step is None or arm is None:
                raise self.fail(where, "a curve point needs `step` and `arm`")
        if "what" in body:
            self.text(body["what"], f"{where}.what")
        for key in ("unit", "note"):
            if key in body:
                self.text(body[key], f"{where}.{key}")
        return Reported(
            value=value, sources=tuple(tags), arm=arm, row=body.get("row"), metric=body.get("metric"), step=step,
            what=body.get("what"), unit=body.get("unit"), note=body.get("note"),
        )
