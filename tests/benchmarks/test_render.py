"""The docs' figures are rendered from the result files (benchmarks/render.py): the
committed pages match the committed results, and the check catches a page that drifts
from its result file."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))

from render import README_END, README_START, ROOT, MarkersMissingError, render, splice_readme
from results import RESULTS_DIR

MARKED_README = f"# absflow\n\nIntro.\n\n{README_START}\nold figures\n{README_END}\n\nMore.\n"


def test_the_committed_pages_are_rendered_from_the_committed_results() -> None:
    assert (RESULTS_DIR / "evaluate.json").exists(), "benchmarks/results/ holds no results"
    readme = ROOT / "README.md"
    problems = render(RESULTS_DIR, ROOT / "docs", readme, check=True)
    if README_START not in readme.read_text(encoding="utf-8"):
        # the README's headline block is placed by the docs' branch; until then the check
        # says so, and nothing else may be stale
        assert len(problems) == 1 and "has no headline block" in problems[0], problems
    else:
        assert problems == []


@pytest.fixture
def copy(tmp_path: Path) -> tuple[Path, Path, Path]:
    """The committed results, rendered into a docs folder and a README of their own."""
    results, docs, readme = tmp_path / "results", tmp_path / "docs", tmp_path / "README.md"
    shutil.copytree(RESULTS_DIR, results)
    docs.mkdir()
    readme.write_text(MARKED_README, encoding="utf-8")
    assert render(results, docs, readme, check=False) == []
    assert render(results, docs, readme, check=True) == []
    return results, docs, readme


def edit(path: Path, change: dict[str, object]) -> None:
    doc = json.loads(path.read_text(encoding="utf-8"))
    doc["figures"].update(change)
    path.write_text(json.dumps(doc), encoding="utf-8")


def test_a_changed_throughput_result_makes_its_page_and_the_readme_stale(
    copy: tuple[Path, Path, Path],
) -> None:
    results, docs, readme = copy
    figures = json.loads((results / "throughput.json").read_text(encoding="utf-8"))["figures"]
    per_round = figures["per_round"]
    per_round["b2p"] = [x * 1.5 for x in per_round["b2p"]]
    edit(results / "throughput.json", {"per_round": per_round})
    problems = render(results, docs, readme, check=True)
    stale = sorted(Path(p.split(" is stale")[0]).name for p in problems)
    assert stale == ["README.md", "benchmarks.md"], problems


def test_a_changed_evaluation_makes_its_page_stale(copy: tuple[Path, Path, Path]) -> None:
    results, docs, readme = copy
    figures = json.loads((results / "evaluate.json").read_text(encoding="utf-8"))["figures"]
    edit(results / "evaluate.json", {"capacity": figures["capacity"] + 1000})
    problems = render(results, docs, readme, check=True)
    assert [Path(p.split(" is stale")[0]).name for p in problems] == ["evaluation.md"]


def test_a_hand_edited_figure_is_caught(copy: tuple[Path, Path, Path]) -> None:
    results, docs, readme = copy
    page = docs / "benchmarks.md"
    page.write_text(page.read_text(encoding="utf-8").replace(" M [", " M  [", 1))
    assert any("benchmarks.md is stale" in p for p in render(results, docs, readme, True))


def test_a_readme_without_the_markers_is_named_with_the_fix(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text("# absflow\n", encoding="utf-8")
    problems = render(RESULTS_DIR, tmp_path, readme, check=True)
    [missing] = [p for p in problems if "headline block" in p]
    assert README_START in missing and README_END in missing and str(readme) in missing


def test_the_headline_block_replaces_only_what_is_between_the_markers() -> None:
    once = splice_readme(MARKED_README, "| a | b |\n", Path("README.md"))
    assert once.startswith("# absflow\n\nIntro.\n\n") and once.endswith("\n\nMore.\n")
    assert "old figures" not in once and f"{README_START}\n| a | b |\n{README_END}" in once
    assert splice_readme(once, "| a | b |\n", Path("README.md")) == once
    with pytest.raises(MarkersMissingError):
        splice_readme(f"{README_END}\n{README_START}\n", "x", Path("README.md"))


def test_every_result_file_names_its_command_commit_and_machine() -> None:
    docs = sorted(RESULTS_DIR.glob("*.json"))
    assert docs, "benchmarks/results/ holds no results"
    for path in docs:
        doc = json.loads(path.read_text(encoding="utf-8"))
        assert doc["command"].startswith("python benchmarks/"), path
        # a run of committed code: the commit names what ran
        assert doc["commit"] != "unknown" and not doc["commit"].endswith("+dirty"), path
        assert doc["machine"]["cores"] and doc["machine"]["cpu"], path
        assert doc["date"] and doc["figures"], path
