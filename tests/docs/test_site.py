"""The docs site builds with ``mkdocs build --strict`` (no broken link or anchor, no page
left out of the nav, no failing API reference), its generated tables come from the code,
every JobConfig setting has a help text, and the README stays a landing page."""

from __future__ import annotations

import dataclasses
import pathlib
import re
import subprocess
import sys
from typing import Any

import pytest

from runtime.config import JobConfig

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent
README_MAX_LINES = 260
COMMIT_HASH = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b")
DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")


def fields_without_help(cls: Any) -> list[str]:
    """The dataclass fields of ``cls`` whose ``metadata["help"]`` is missing or blank."""
    return [f.name for f in dataclasses.fields(cls) if not str(f.metadata.get("help", "")).strip()]


def test_every_setting_has_help_text() -> None:
    missing = fields_without_help(JobConfig)
    assert not missing, (
        f"JobConfig settings without help text: {missing}; declare each as "
        'field(default=..., metadata={"help": "one sentence"}) in runtime/config.py '
        "(the configuration page is generated from it)"
    )


def test_the_help_check_catches_a_field_without_help() -> None:
    @dataclasses.dataclass(frozen=True)
    class Settings:
        documented: int = dataclasses.field(default=1, metadata={"help": "A count."})
        undocumented: int = 2
        blank: int = dataclasses.field(default=3, metadata={"help": " "})

    assert fields_without_help(Settings) == ["undocumented", "blank"]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stdout}\n{done.stderr}"
    return out


def test_the_site_builds_strictly(site: pathlib.Path) -> None:
    assert (site / "index.html").exists()
    reference = (site / "reference" / "dataflow" / "index.html").read_text()
    assert 'id="runtime.Dataflow.run"' in reference, "mkdocstrings rendered no Dataflow.run"


def test_the_configuration_page_lists_every_setting(site: pathlib.Path) -> None:
    page = (site / "configuration" / "index.html").read_text()
    for f in dataclasses.fields(JobConfig):
        assert f"<code>{f.name}</code>" in page, f"{f.name} is missing from configuration.md"
        assert str(f.metadata["help"]).split()[0] in page


def test_the_rest_and_metric_tables_come_from_the_code(site: pathlib.Path) -> None:
    from jobmanager.web.api import API
    from jobmanager.web.prom import METRICS

    page = (site / "monitoring" / "index.html").read_text()
    for endpoint in API:
        assert f"<code>{endpoint.path}</code>" in page
    for metric in METRICS:
        assert f"<code>{metric.exposed_name}</code>" in page


def test_the_readme_is_a_landing_page() -> None:
    text = (ROOT / "README.md").read_text()
    lines = text.splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines (at most ~250)"
    start, end = "<!-- results:headline -->", "<!-- /results:headline -->"
    assert start in text and end in text, "the headline-figures markers must stay"
    # the generated headline block may carry its own stamp (a commit); nothing else may
    outside = text[: text.index(start)] + text[text.index(end) :]
    assert not COMMIT_HASH.findall(outside), (
        f"commit hashes in README.md: {COMMIT_HASH.findall(outside)}"
    )
    assert not DATE.findall(outside), f"dated figures in README.md: {DATE.findall(outside)}"
    assert "pip install -e . && python examples/wordcount.py" in text
    assert "pip install -e '.[test]' && pytest" in text


def test_the_hash_and_date_checks_catch_them() -> None:
    assert COMMIT_HASH.findall("measured at 3a2117c on the machine") == ["3a2117c"]
    assert not COMMIT_HASH.findall("20000000 records, deadbeef, 1234567")
    assert DATE.findall("measured on 2026-11-26, 5 rounds") == ["2026-11-26"]


LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def missing_links(markdown: str) -> list[str]:
    """The relative link targets of ``markdown`` that are no file of the repository."""
    targets = [t for t in LINK.findall(markdown) if "://" not in t]
    return [t for t in targets if not (ROOT / t).exists()]


def test_the_readme_links_resolve() -> None:
    """mkdocs checks the site's links; the README is outside it, so its own are checked
    here: every relative link names a file of the repository."""
    text = (ROOT / "README.md").read_text()
    assert "](docs/" in text, "the README links no docs page"
    assert not missing_links(text), f"README.md links missing files: {missing_links(text)}"


def test_the_link_check_catches_a_missing_page() -> None:
    text = "[ok](docs/concepts.md#tasks) [gone](docs/nowhere.md) [web](https://example.org/x)"
    assert missing_links(text) == ["docs/nowhere.md"]
