"""Render the docs' figures from the benchmarks' result files, or check they are current.

    python benchmarks/render.py            # write docs/benchmarks.md, docs/evaluation.md
                                           # (+ its plots) and the README's headline block
    python benchmarks/render.py --check    # exit 1 naming every page that is stale

Every figure on those pages comes from a file under ``benchmarks/results/`` (written by
the benchmark through ``benchmarks/results.py``: command, date, commit, machine, rounds,
figures); nothing is typed by hand. ``docs/benchmarks.md`` has one section per
benchmark (what it measures, the command, its figures with spread and rounds, the stamp),
``docs/evaluation.md`` is rendered from ``evaluate.json`` (the papers' figures and the
verdicts their intervals allow, benchmarks/verdicts.py), and the README's lines between
``<!-- results:headline -->`` and ``<!-- /results:headline -->`` get the headline table.
``--check`` compares the Markdown only (the plots follow the same result file).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import sections
from eval_data import Evaluation
from eval_report import Report, plots
from results import RESULTS_DIR, stamp

ROOT = Path(__file__).resolve().parent.parent
README_START = "<!-- results:headline -->"
README_END = "<!-- /results:headline -->"


class MarkersMissingError(ValueError):
    """The README has no headline block to fill."""


@dataclass(frozen=True)
class Page:
    """One file the renderer owns (or, for the README, owns a block of)."""

    path: Path
    text: str


def results_of(directory: Path) -> dict[str, dict[str, object]]:
    """Every result file in ``directory``, by benchmark name."""
    return {
        p.stem: json.loads(p.read_text(encoding="utf-8")) for p in sorted(directory.glob("*.json"))
    }


def evaluation_report(doc: dict[str, object]) -> Report:
    machine = doc.get("machine") or {}
    cores = int(machine.get("cores") or 0) if isinstance(machine, dict) else 0
    figures = doc["figures"]
    assert isinstance(figures, dict)
    return Report(Evaluation.from_json(figures), stamp=stamp(doc), cores=cores)


def splice_readme(readme: str, block: str, path: Path) -> str:
    """``readme`` with the text between the headline markers replaced by ``block``.
    Raises MarkersMissingError naming ``path`` when the markers are not there once each,
    in order."""
    start, end = readme.find(README_START), readme.find(README_END)
    if start < 0 or end < start or readme.count(README_START) != 1 or readme.count(README_END) != 1:
        raise MarkersMissingError(
            f"{path} has no headline block: put the lines {README_START} and {README_END} "
            "(once each, in that order) where the figures go, then run "
            "`python benchmarks/render.py`."
        )
    head = readme[: start + len(README_START)]
    return head + "\n" + block.rstrip("\n") + "\n" + readme[end:]


def pages(results: Path, docs: Path) -> list[Page]:
    """The docs pages rendered from the result files in ``results``."""
    docs_by_name = results_of(results)
    out = [Page(docs / "benchmarks.md", sections.benchmarks_page(docs_by_name))]
    if "evaluate" in docs_by_name:
        report = evaluation_report(docs_by_name["evaluate"])
        text = (
            report.markdown()
            + "\n"
            + "\n".join(f"![{name}]({name})" for name in sections.EVALUATION_PLOTS)
        )
        out.append(Page(docs / "evaluation.md", text + "\n"))
    return out


def readme_page(results: Path, readme: Path) -> Page:
    """The README with its headline block rendered (MarkersMissingError without one)."""
    block = sections.headline(results_of(results))
    return Page(readme, splice_readme(readme.read_text(encoding="utf-8"), block, readme))


def render(results: Path, docs: Path, readme: Path, check: bool) -> list[str]:
    """Render every page from ``results``; with ``check``, write nothing and return what
    is stale (or missing) instead. Returns the problems, each naming its file and fix."""
    problems: list[str] = []
    rendered = pages(results, docs)
    try:
        rendered.append(readme_page(results, readme))
    except MarkersMissingError as err:
        problems.append(str(err))
    for page in rendered:
        current = page.path.read_text(encoding="utf-8") if page.path.exists() else None
        if current == page.text:
            continue
        if check:
            problems.append(
                f"{page.path} is stale: it differs from what {results} renders; run "
                "`python benchmarks/render.py` (never edit a figure by hand)."
            )
        else:
            page.path.write_text(page.text, encoding="utf-8")
            print(f"wrote {page.path}")
    if not check and (results / "evaluate.json").exists():
        report = evaluation_report(results_of(results)["evaluate"])
        for png in plots(report, str(docs)):
            print(f"wrote {png}")
    return problems


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if a rendered page is stale")
    ap.add_argument("--results", type=Path, default=RESULTS_DIR, help="result files' folder")
    ap.add_argument("--docs", type=Path, default=ROOT / "docs", help="the docs folder")
    ap.add_argument("--readme", type=Path, default=ROOT / "README.md")
    args = ap.parse_args(argv)
    problems = render(args.results, args.docs, args.readme, args.check)
    for problem in problems:
        print(problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
