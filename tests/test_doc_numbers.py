"""The measured numbers in README.md, docs/ and experiments/ are the ones in the files the measuring
scripts write: every marker re-renders to exactly what the docs hold (scripts/doc_numbers.py)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("doc_numbers", REPO / "scripts" / "doc_numbers.py")
doc_numbers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(doc_numbers)


@pytest.mark.parametrize("path", doc_numbers.documents(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_marked_number_matches_the_measurement_files(path):
    stale = doc_numbers.stale(path)
    assert not stale, f"{len(stale)} stale marker(s) in {path.name}; run python scripts/doc_numbers.py:\n" + \
        "\n".join(s[:200] for s in stale)


def test_the_main_docs_quote_measurements_through_markers():
    for name in ("README.md", "docs/local.md", "docs/report.md"):
        assert doc_numbers.MARKER.search((REPO / name).read_text()), name


@pytest.fixture
def sources(tmp_path, monkeypatch):
    (tmp_path / "r.json").write_text(json.dumps({"a": {"x": 0.4629, "ratio": 1.226, "s": 83.4, "lines": ["one", "two"]}}))
    (tmp_path / "table.md").write_text("| a |\n|---|\n")
    monkeypatch.setattr(doc_numbers, "SOURCES", {"r": "r.json"})
    return tmp_path


def test_markers_render_numbers_blocks_and_files(sources):
    text = ("x <!-- num:r/a/x|.3f -->0<!-- /num --> +<!-- num:r/a/ratio|excess_pct|.0f -->0<!-- /num --> % "
            "<!-- num:r/a/s|min_s -->0<!-- /num -->\n<!-- code:r/a/lines -->\n<!-- /code -->\n"
            "<!-- include:table.md --><!-- /include -->")
    assert doc_numbers.render(text, sources) == (
        "x <!-- num:r/a/x|.3f -->0.463<!-- /num --> +<!-- num:r/a/ratio|excess_pct|.0f -->23<!-- /num --> % "
        "<!-- num:r/a/s|min_s -->1 min 23 s<!-- /num -->\n<!-- code:r/a/lines -->\n```\none\ntwo\n```\n<!-- /code -->\n"
        "<!-- include:table.md -->\n| a |\n|---|\n<!-- /include -->")


def test_a_number_that_disagrees_with_its_file_is_stale(sources):
    doc = sources / "doc.md"
    doc.write_text("end <!-- num:r/a/x|.3f -->0.463<!-- /num -->, again <!-- num:r/a/x|.2f -->0.47<!-- /num -->")
    assert doc_numbers.stale(doc, sources) == ["<!-- num:r/a/x|.2f -->0.47<!-- /num -->"]


def test_a_key_that_does_not_exist_is_an_error(sources):
    with pytest.raises(doc_numbers.StaleKeyError, match="r.json has no 'y' there"):
        doc_numbers.render("<!-- num:r/a/y -->1<!-- /num -->", sources)
    with pytest.raises(doc_numbers.StaleKeyError, match="unknown source 'q'"):
        doc_numbers.render("<!-- num:q/a -->1<!-- /num -->", sources)
