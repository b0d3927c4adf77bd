"""The runnable code blocks of the README and the docs pages.

A block is runnable when the line right before its opening fence is the marker
``<!-- runnable -->``::

    <!-- runnable -->
    ```python
    ...
    ```

Each such block is a whole program: it runs on its own, in a fresh interpreter, in an
empty temp directory, on the local launcher (no Spark), and passes when it exits 0. Other
blocks (fragments, cluster commands, what needs a server) are illustrations and are not
run. docs/contributing.md says the same for authors.
"""

from __future__ import annotations

import pathlib
import re
from dataclasses import dataclass

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent
MARKER = "<!-- runnable -->"
_FENCE = re.compile(r"^(`{3,})python\s*$")


@dataclass(frozen=True)
class Snippet:
    """One runnable block: where it is (for the test id and the failure message) and its
    code."""

    path: str  # relative to the repository root
    line: int  # 1-based line of the opening fence
    code: str

    @property
    def id(self) -> str:
        return f"{self.path}:{self.line}"


def snippets_in(text: str, path: str) -> list[Snippet]:
    """The runnable blocks of one Markdown text. A marker inside another fenced block
    (an example of the marker itself) does not count. A marker not followed by a
    ```python fence, or a block that never closes, raises ValueError naming the line."""
    lines = text.splitlines()
    found: list[Snippet] = []
    fence: str | None = None  # the fence of the block we are in, if any
    i = 0
    while i < len(lines):
        stripped = lines[i].strip()
        if fence is not None:
            if stripped == fence:
                fence = None
        elif stripped.startswith("```"):
            fence = stripped[: len(stripped) - len(stripped.lstrip("`"))]
        elif stripped == MARKER:
            opening = _FENCE.match(lines[i + 1].strip()) if i + 1 < len(lines) else None
            if opening is None:
                raise ValueError(
                    f"{path}:{i + 1}: {MARKER} must be followed directly by a ```python fence"
                )
            close = opening.group(1)
            for j in range(i + 2, len(lines)):
                if lines[j].strip() == close:
                    found.append(Snippet(path, i + 2, "\n".join(lines[i + 2 : j]) + "\n"))
                    i = j
                    break
            else:
                raise ValueError(f"{path}:{i + 2}: the runnable block never closes")
        i += 1
    return found


def markdown_files() -> list[pathlib.Path]:
    """The README and every page of the docs site."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def all_snippets() -> list[Snippet]:
    out: list[Snippet] = []
    for md in markdown_files():
        out.extend(snippets_in(md.read_text(), str(md.relative_to(ROOT))))
    return out
