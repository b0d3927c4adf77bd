"""MkDocs hook: the reference tables generated from the code, one source of truth each.

A page holds a marker line ``<!-- generated:NAME -->``; at build time the hook replaces
it with the table NAME renders:

- ``config``: every field of ``runtime.config.JobConfig`` (name, type, default and the
  ``metadata["help"]`` text). A field without help text fails the build.
- ``rest``: the endpoints of ``jobmanager.web.api.API``.
- ``prometheus``: the metric families of ``jobmanager.web.prom.METRICS``.

An unknown marker fails the build too, so a typo cannot leave a table out silently.
"""

from __future__ import annotations

import dataclasses
import enum
import html
import pathlib
import re
import sys
from collections.abc import Callable
from typing import Any

# This checkout's packages, imported while the hook loads (mkdocs restores sys.path after
# loading a hook, and an installed absflow elsewhere would otherwise answer the imports).
ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
try:
    from jobmanager.web.api import API
    from jobmanager.web.prom import METRICS
    from runtime.config import JobConfig
finally:
    sys.path.remove(str(ROOT))

MARKER = re.compile(r"^<!-- generated:([a-z_]+) -->$", re.MULTILINE)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _code(text: str) -> str:
    """Inline code in a table cell: a backtick span would show an escaped pipe as ``\\|``."""
    return "<code>" + html.escape(text).replace("|", "&#124;") + "</code>"


def _default(f: dataclasses.Field[Any]) -> str:
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
    else:
        return "(required)"
    if isinstance(value, enum.Enum):
        value = value.value
    return f"`{value!r}`"


def config_table() -> str:

    rows = ["| setting | type | default | meaning |", "|---|---|---|---|"]
    for f in dataclasses.fields(JobConfig):
        help_text = f.metadata.get("help")
        if not help_text:
            raise ValueError(
                f"JobConfig.{f.name} has no help text: declare it as "
                f'field(default=..., metadata={{"help": "one sentence"}}) in runtime/config.py'
            )
        kind = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
        rows.append(f"| `{f.name}` | {_code(kind)} | {_cell(_default(f))} | {_cell(help_text)} |")
    return "\n".join(rows)


def rest_table() -> str:
    rows = ["| endpoint | parameters | answer |", "|---|---|---|"]
    for e in API:
        params = ", ".join(f"`{p}`" for p in e.params) or "none"
        rows.append(f"| `{e.path}` | {params} | {_cell(e.description)} |")
    return "\n".join(rows)


def prometheus_table() -> str:
    rows = ["| metric | type | labels | meaning |", "|---|---|---|---|"]
    for m in METRICS:
        labels = ", ".join(f"`{label}`" for label in m.labels)
        rows.append(f"| `{m.exposed_name}` | {m.type.value} | {labels} | {_cell(m.help)} |")
    return "\n".join(rows)


TABLES: dict[str, Callable[[], str]] = {
    "config": config_table,
    "rest": rest_table,
    "prometheus": prometheus_table,
}


def render(markdown: str, where: str) -> str:
    """``markdown`` with every marker replaced by its table."""

    def table(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in TABLES:
            raise ValueError(f"{where}: unknown table marker {name!r}; known: {sorted(TABLES)}")
        return TABLES[name]()

    return MARKER.sub(table, markdown)


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    return render(markdown, page.file.src_uri)
