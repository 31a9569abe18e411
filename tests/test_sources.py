"""Every source tag a config value or a reported number cites is defined in docs/sources.md."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
CONF = ROOT / "molt_flashreinforce" / "conf"


def defined_tags() -> set[str]:
    rows = (ROOT / "docs" / "sources.md").read_text().splitlines()
    tags = set()
    for row in rows:
        if row.startswith("| ") and not row.startswith("| tag") and not row.startswith("|---"):
            tags.update(tag.strip() for tag in row.split("|")[1].split(","))
    return tags


def test_config_source_tags_are_defined():
    cited = set()
    for path in CONF.rglob("*.yaml"):
        for comment in re.findall(r"#.*", path.read_text()):
            cited.update(re.findall(r"\[([A-Z][A-Za-z0-9]*(?::[a-z0-9_]+)?)\]", comment))
    cited.discard("ALFWORLD_DATA")  # an environment variable in brackets, not a source
    assert cited, "no source tags found: the pattern no longer matches the configs"
    assert cited <= defined_tags(), f"undefined source tags: {sorted(cited - defined_tags())}"


def test_paper_results_sources_are_defined():
    results = yaml.safe_load((ROOT / "experiments" / "paper_results.yaml").read_text())
    assert set(results["sources"]) <= defined_tags()
